"""The sentence splitter: rule-based, abbreviations and initials stay inside their sentence.

A boundary is end punctuation (+ closing quotes/brackets), whitespace, then an opening capital or
digit, unless the text before it ends like a title, an initial or an abbreviation ("Dr.", "J.",
"U.S.", "Jan."). Used by sentence chunking (``tasks.text.chunk``) and by the extractive
summariser (``tasks.llm.summarize``).
"""
from __future__ import annotations

import re

# a boundary: end punctuation (+ closing quotes/brackets), whitespace, then an opening capital/digit
_BOUNDARY = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-Z0-9])")
# a piece ending like this did not end a sentence: titles, initials ("J."), "U.S.", "No.", "St."
_NOT_AN_END = re.compile(
    r"(?:\b(?:Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|Mt|Ft|No|Vol|vs|etc|Inc|Ltd|Co|Corp|Gen|Col|Lt|Sgt|Rev|Hon|Jan|Feb|Mar|"
    r"Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|approx|ca|c)\.|\b[A-Z]\.|\b(?:[A-Za-z]\.){2,})$")


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Rule-based sentence split as (start, end) character spans; abbreviations and initials stay inside."""
    cuts = [m.end() for m in _BOUNDARY.finditer(text)]
    starts = [0] + [c for c in cuts if not _NOT_AN_END.search(text[:c].rstrip())]
    ends = starts[1:] + [len(text)]
    spans = []
    for a, b in zip(starts, ends):
        piece = text[a:b]
        lead, trail = len(piece) - len(piece.lstrip()), len(piece.rstrip())
        if trail > lead:
            spans.append((a + lead, a + trail))
    return spans


def split_sentences(text: str) -> list[str]:
    """The sentences of a text, in order."""
    return [text[a:b] for a, b in sentence_spans(text)]
