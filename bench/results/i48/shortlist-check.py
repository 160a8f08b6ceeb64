"""The shortlist's bank places for three handwritten complaint sets (none from the simulator), by
novelty: 0 is the nearest six, as before; 0.5 is the default.

    .venv/bin/python bench/results/i48/shortlist-check.py
"""

from judge.hints import InstructionChooser

SETS = {
    "structure": ["one big block of text again, I can't scan this", "too dense, hard to pick out the steps",
                  "wall of text. hard to read"],
    "length": ["way too long, I only needed the gist", "that's an essay, I asked a quick question"],
    "jargon": ["too much jargon, I'm not an engineer", "what do half these words mean?"],
}

chooser = InstructionChooser(shortlist=24)
for name, texts in SETS.items():
    for novelty in (0.0, 0.5, 1.0):
        print(name, novelty, [x for _, x in chooser.diverse(texts, 6, novelty=novelty)])
