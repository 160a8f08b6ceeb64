"""Does the bank's shortlist hold a line that fixes what the complaints describe? Validation sets
written here for this check (none from a persona file or a simulated user), each: three complaints
that only describe the problem, and the bank lines that would fix it.

Compares how the query is formed from the complaints: their mean embedding (one centroid), or each
complaint's own nearest lines (relevance = the largest cosine to any complaint). Both then pick k by
maximal marginal relevance, as judge/trying.py does.

    .venv/bin/python bench/results/i59/shortlist_validation.py
"""

from __future__ import annotations

import numpy as np

from judge.hints import InstructionChooser

SETS: dict[str, tuple[list[str], list[str]]] = {
    "filler": (["why do you open with a compliment every time", "all that padding before you get to the info",
                "the 'hope this helps' at the end is noise"],
               ["Avoid padding answers with filler.", "Skip pleasantries and greetings.", "Skip openers like great question.",
                "Stop praising my questions.", "End without offering further help.", "Skip the preamble and get to the point.",
                "Avoid flattery and compliments."]),
    "structure": (["one big blob, I can't find anything", "this would be easier to read split into items",
                   "I keep losing track in this paragraph"],
                  ["Use bullet points for lists of items.", "Use numbered steps for instructions.",
                   "Use short paragraphs separated by blank lines.", "Use checklists for tasks I need to complete.",
                   "Summarize long texts in a few key points.", "Limit answers to three bullet points."]),
    "length": (["I asked something simple and got an essay", "way more than I need", "trim it down"],
               ["Keep answers under 50 words.", "Keep answers under 100 words.", "Answer in one sentence.",
                "Answer in two sentences or fewer.", "Keep replies short and to the point.",
                "Be concise and cut unnecessary words.", "Give me just the result."]),
    "bottom_line": (["I just want the bottom line somewhere obvious", "where's the summary",
                     "too long to read all of it, give me the gist"],
                    ["End with a TL;DR line.", "Put the TL;DR at the very beginning.", "Start with a one-sentence summary.",
                     "Put a summary at the top of the answer.", "Give me the short version first, then details.",
                     "Summarize long texts in a few key points."]),
    "sections": (["hard to navigate, no sections", "can't tell where one part ends and the next starts",
                  "organize this better"],
                 ["Use headings to organize long answers.", "Group related points under subheadings.",
                  "Use short paragraphs separated by blank lines."]),
    "order": (["what order do I do these in?", "I need to follow along one thing at a time", "which comes first"],
              ["Use numbered steps for instructions.", "Explain things step by step.", "Break large tasks into smaller steps."]),
    "certainty": (["how sure are you about that?", "you say it like it's certain, is it?", "I can't tell if that's a guess"],
                  ["Give a confidence level for your claims.", "Tell me when you are unsure.",
                   "Separate verified facts from assumptions.", "Give probability estimates when uncertain.",
                   "Distinguish facts from opinions.", "Admit when you do not know something."]),
    "abstract": (["this is too abstract", "show me what that looks like in practice", "I don't get it without a concrete case"],
                 ["Give concrete examples to illustrate points.", "Include at least one example in every answer.",
                  "Include a worked example.", "Use analogies to explain hard concepts.", "Include a real-world use case."]),
    "jargon": (["what does half of this even mean", "plain english please", "too technical for me"],
               ["Use simple, everyday words.", "Avoid technical jargon where plain words work.",
                "Explain it for a complete beginner.", "Define technical terms when you first use them.",
                "Write at a middle-school reading level.", "Explain it like I am five years old."]),
    "sorry": (["stop saying sorry", "you apologize way too much", "no need to apologise every reply"],
              ["Do not apologize in your answers."]),
    "icons": (["what's with all the smileys", "the emojis are distracting", "lose the little icons"],
              ["Do not use any emojis."]),
    "code": (["I just wanted the snippet, not the lecture", "skip the explanation and show the code",
              "too much talk around the code"],
             ["Give me the code with no explanation.", "Reply with code blocks only.",
              "Keep code as short and minimal as possible.", "Give me just the result."]),
    "stiff": (["this reads like a press release", "so stiff and formal", "loosen up a bit"],
              ["Write in a casual, conversational tone.", "Talk to me like a friend would.",
               "Avoid sounding robotic or scripted.", "Write like a human, not a chatbot.",
               "Use contractions for a natural voice.", "Avoid corporate buzzwords and marketing speak."]),
    "questions_back": (["quit ending with a question", "don't ask me what else I need", "every answer ends with 'anything else?'"],
                       ["Do not ask me follow-up questions.", "End without offering further help."]),
}


def per_complaint(chooser: InstructionChooser, texts: list[str], k: int, novelty: float) -> list[str]:
    """Relevance = the largest cosine to any one complaint; then the same MMR."""
    chooser.nearest(texts)  # embeds the bank once
    bank, embed = chooser._bank, chooser.embed
    q = embed(texts)
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    rel = (bank @ q.T).max(axis=1)
    pool = list(np.argsort(-rel)[: chooser.shortlist])
    out: list[int] = []
    while pool and len(out) < k:
        over = [max((float(bank[i] @ bank[j]) for j in out), default=0.0) for i in pool]
        best = int(np.argmax([rel[i] - novelty * o for i, o in zip(pool, over, strict=True)]))
        out.append(pool.pop(best))
    return [chooser.instructions[i] for i in out]


def main() -> None:
    k = 6
    chooser = InstructionChooser(shortlist=k * 4)
    for name, pick in (("mean", lambda t: [x for _, x in chooser.diverse(t, k, novelty=0.5)]),
                       ("per-complaint", lambda t: per_complaint(chooser, t, k, 0.5))):
        hits, ranks = 0, []
        for set_name, (texts, fixes) in SETS.items():
            got = pick(texts)
            rank = next((i + 1 for i, x in enumerate(got) if x in fixes), None)
            hits += rank is not None
            ranks.append(rank)
            print(f"{name:14s} {set_name:15s} first fix at {rank}  {got}")
        print(f"== {name}: a fix in the top {k} for {hits} of {len(SETS)} sets\n")


if __name__ == "__main__":
    main()
