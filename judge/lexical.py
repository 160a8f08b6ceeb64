"""Lexical cues for explicit feedback, and the tool-error check.

People who are unhappy with an answer say so in a small vocabulary: "no", "wrong", "I said",
"shorter", "more formal", "try again", "useless", an eye-roll emoji. Happy people thank, praise or
simply move on. These cues are precise when they fire, so they are both a voter of their own
(``LexicalVoter``, for comparison) and features of the embedding voter, which handles what they
miss (restated requests, sarcasm without keywords, moving on without a word of thanks).

The cue lists were written from the train split and general usage; see judge/eval/README.md for
the held-out discipline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# (cue list, pattern) for every cue: tests/judge/test_independence.py checks them against the simulator.
CUE_PATTERNS: list[tuple[str, str]] = []


def cue_rx(name: str, *patterns: str) -> re.Pattern[str]:
    CUE_PATTERNS.extend((name, p) for p in patterns)
    return re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE)


PRAISE = cue_rx(
    "praise",
    r"\bthanks?\b(?!\s+for\s+nothing)",
    r"\bthank\s*(?:you|u)\b",
    r"\bthx\b",
    r"\bty\b",
    r"\btysm\b",
    r"\bcheers\b",
    r"\bappreciat",
    r"\bmuch obliged\b",
    r"\bgrazie\b",
    r"\bmerci\b",
    r"\bdanke\b",
    r"\bgracias\b",
    r"\barigat",
    r"\bta\b(?!\s*-)",
    r"\bkudos\b",
)
POSITIVE = cue_rx(
    "positive",
    r"\bperfect\b",
    r"\bgreat\b",
    r"\bawesome\b",
    r"\bexcellent\b",
    r"\bnice\b",
    r"\blove(?:ly)?\b",
    r"\bbrilliant\b",
    r"\bamazing\b",
    r"\bspot[ -]on\b",
    r"\bexactly\b",
    r"\bworks?\b",
    r"\bworked\b",
    r"\bthat did it\b",
    r"\blgtm\b",
    r"\blooks good\b",
    r"\bwell done\b",
    r"\bgood job\b",
    r"\bhelpful\b",
    r"\bmakes sense\b",
    r"\bclear\b",
    r"\bclicks?\b",
    r"\bsweet\b",
    r"\bcool\b",
    r"\bfantastic\b",
    r"\bwonderful\b",
    r"\blifesaver\b",
    r"\bnailed it\b",
    r"\bthat's it\b",
    r"\bthis is it\b",
    r"\bsolved\b",
    r"\bfixed\b",
    r"\bgot it\b",
    r"\byes!",
    r"\bgood\b",
    r"\bhelped\b",
    r"\bTIL\b",
    r"\binteresting\b",
    "👍",
    "🙏",
    "❤",
    "🎉",
    "💪",
    "🔥",
    "😍",
    "🙇",
    "👌",
    "🥳",
    "😊",
    "✅",
)
CORRECTION = cue_rx(
    "correction",
    r"^\s*no\b",
    r"\bnope\b",
    r"\bwrong\b",
    r"\bincorrect\b",
    r"\bnot (?:right|correct|true|what)\b",
    r"\b(?:that's|thats|that is|this is|it's|its) not\b",
    r"^\s*actually\b",
    r"^\s*\S+\s+actually\s*$",
    r"\bpretty sure\b",
    r"^\s*not (?:always|quite|really|exactly|necessarily)\b",
    r"^\s*(?:yes|yeah|ok|okay|sure|right),? but\b",
    r"\bi (?:said|asked|meant|wanted|told you)\b",
    r"\byou (?:forgot|missed|left out|didn't|did not|skipped|ignored)\b",
    r"\bmade (?:that |it |this )?up\b",
    r"\bdoesn't (?:work|exist)\b",
    r"\bdon't exist\b",
    r"\bdidn't work\b",
    r"\bstill (?:fails|failing|broken|wrong|doesn't|over|too)\b",
    r"\bbroken\b",
    r"\boff by\b",
    r"\bnot \w+,? (?:but|it's)\b",
    r", not \w+",
    r"\binstead\b",
    r"\bmistake\b",
    r"\bfix (?:it|that|this)\b",
    r"\bplease fix\b",
    r"\bunchanged\b",
    r"\bnothing changed\b",
    r"\bcan't be right\b",
)
REDO = cue_rx(
    "redo",
    r"\bshorter\b",
    r"\blonger\b",
    r"\btoo (?:long|short|stiff|formal|casual|vague|wordy|verbose|much|cold|complicated)\b",
    r"\bway (?:too|more)\b",
    r"\bsimpler\b",
    r"\bmore (?:formal|casual|detail|polite|specific)\b",
    r"\bless (?:formal|boring|corporate|wordy)\b",
    r"\bbrief(?:ly)?\b",
    r"\bconcise\b",
    r"\bcondense\b",
    r"\bredo\b",
    r"\b(?:try|do it|write it|say it|once) again\b",
    r"\bre-?write\b",
    r"\btl;?dr\b",
    r"\bplain english\b",
    r"\bcatchier\b",
    r"\bfunnier\b",
    r"\bwarmer\b",
    r"\bfriendlier\b",
    r"\bprofessional\b",
    r"\bjust the\b",
    r"\bonly the\b",
    r"^\s*only\b",
    r"\blimit\b",
    r"\bmore than \d+ words\b",
    r"\bunder \d+ words\b",
    r"\bmake it\b",
)
COMPLAINT = cue_rx(
    "complaint",
    r"\buseless\b",
    r"\bterrible\b",
    r"\bawful\b",
    r"\bnot helpful\b",
    r"\bunhelpful\b",
    r"\bthanks for nothing\b",
    r"\bare you (?:broken|serious|kidding)\b",
    r"\bcome on\b",
    r"\bugh+\b",
    r"\bwtf\b",
    r"\bseriously\b",
    r"\bgarbage\b",
    r"\bnonsense\b",
    r"\bgibberish\b",
    r"\bstupid\b",
    r"\bridiculous\b",
    r"\bworse\b",
    r"\bgee\b",
    r"\byeah,? right\b",
    r"\bthat'll definitely\b",
    r"\bvery insightful\b",
    r"\bsuper helpful\b",
    r"\bso helpful\b",
    r"/s\b",
    r"^\W*what\?+!*\W*$",
    "🙄",
    "👎",
    "😒",
    "😠",
    "😡",
    "🤦",
)
CONTRAST = cue_rx("contrast", r"\bbut\b", r"\bhowever\b", r"\bthough\b", r"\bexcept\b")
MOVE_ON = cue_rx(
    "move_on",
    r"^\s*(?:and|now|ok(?:ay)?,? (?:and|now|next)|cool\.?|great\.?|good\.?)\b",
    r"\bnow (?:do|write|run|make|add|the)\b",
    r"\bwhat about\b",
    r"\bhow about\b",
    r"\bnext\b",
    r"\bcan you (?:also|now)\b",
    r"\balso\b",
)
BARE_ACK = re.compile(
    r"^\s*(?:ok(?:ay)?|k+|kk|sure|alright|right|hm+|hmm+|i see|maybe|fine|noted|yeah|yep|ah|oh|"
    r"hm+ ok|ok hm+|lol|haha|brb|one sec|idk)[.!]?\s*$",
    re.IGNORECASE,
)
EMOJI_ONLY = re.compile(r"^[\W_]+$")
TOOL_ERROR = cue_rx(
    "tool_error",
    r"^\s*error\b",
    r"\berror:",
    r"\bERR!",
    r"\bexit(?:ed)? (?:with )?code [1-9]\d*",
    r"\bnot found\b",
    r"\bno such (?:file|container|directory|host)\b",
    r"\btraceback \(most recent",
    r"\b\w+(?:Error|Exception):",
    r"\bpermission denied\b",
    r"\baccess denied\b",
    r"\bENOENT\b",
    r"\bEACCES\b",
    r"^\s*fatal:",
    r"(?<!\b0 )\bfailed\b",
    r"\btimed out\b",
    r'"status"\s*:\s*"error"',
    r'"error"\s*:\s*(?!\s|null)',
    r"\bHTTP [45]\d\d\b",
    r"\bsegmentation fault\b",
    r"\bpanic:",
    r"\*\*\* \[.*\] Error \d",
    r"\bdoes not apply\b",
    r"\bmissing script\b",
)
WORD = re.compile(r"[a-z0-9']+")
STOP = frozenset(
    "a an the to of in on for and or is it i me my you your can could please what whats what's "
    "how do does this that with be are at by from as so just".split()
)


def tool_failed(text: str) -> bool:
    """True when a tool result reads as a failure (non-zero exit, error, traceback, not found)."""
    head = text[:2000]
    if re.search(r"\bexit(?:ed)? (?:with )?code 0\b", head) and not re.search(
        r"\berror\b", head, re.I
    ):
        return False
    return bool(TOOL_ERROR.search(head))


def content_words(text: str) -> set[str]:
    return {w for w in WORD.findall(text.lower()) if w not in STOP and len(w) > 1}


def overlap(a: str, b: str) -> float:
    """Share of the reply's content words that repeat the request (restated requests score high)."""
    wa, wb = content_words(a), content_words(b)
    if not wa or not wb:
        return 0.0
    return len(wa & wb) / len(wa)


@dataclass
class Cues:
    praise: int
    positive: int
    correction: int
    redo: int
    complaint: int
    contrast: int
    move_on: int
    bare_ack: bool
    emoji_only: bool
    question: bool
    words: int
    overlap: float

    @property
    def negative(self) -> int:
        return self.correction + self.redo + self.complaint

    def features(self) -> dict[str, float]:
        """Features for the embedding voter's head, by name (bounded, so no cue dominates by count)."""
        return {
            "praise": min(self.praise, 2) / 2,
            "positive": min(self.positive, 2) / 2,
            "correction": min(self.correction, 2) / 2,
            "redo": min(self.redo, 2) / 2,
            "complaint": min(self.complaint, 2) / 2,
            "contrast": float(self.contrast > 0),
            "move_on": float(self.move_on > 0),
            "bare_ack": float(self.bare_ack),
            "emoji_only": float(self.emoji_only),
            "question": float(self.question),
            "log_words": min(float(np.log1p(self.words)) / 4, 1.0),
            "overlap": self.overlap,
        }

    def vector(self) -> np.ndarray:
        return np.array(list(self.features().values()), dtype=np.float32)


def cues(next_text: str, request: str = "") -> Cues:
    # phones type curly apostrophes ("that’s not"); the cue lists are written with straight ones
    text = next_text.strip().replace("\u2019", "'").replace("\u2018", "'")
    return Cues(
        praise=len(PRAISE.findall(text)),
        positive=len(POSITIVE.findall(text)),
        correction=len(CORRECTION.findall(text)),
        redo=len(REDO.findall(text)),
        complaint=len(COMPLAINT.findall(text)),
        contrast=len(CONTRAST.findall(text)),
        move_on=len(MOVE_ON.findall(text)),
        bare_ack=bool(BARE_ACK.match(text)),
        emoji_only=bool(text) and bool(EMOJI_ONLY.match(text)),
        question="?" in text,
        words=len(WORD.findall(text.lower())),
        overlap=overlap(text, request),
    )


def lexical_score(c: Cues) -> int:
    """The rule cascade: explicit complaint beats praise (mixed messages are corrections)."""
    if c.negative:
        return -1
    if c.praise or c.positive:
        return 1
    if c.bare_ack or c.emoji_only:
        return 0
    if c.overlap >= 0.6 and c.words >= 3:
        return -1
    if c.move_on:
        return 1
    return 0


CUE_NAMES = list(cues("").features())  # the head's column names, in vector() order
