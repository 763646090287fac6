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


# how far back from a boundary _NOT_AN_END needs to look: its longest fixed word ("approx.") and the character
# before it for \b. A longer run of initials ("U.S.A.") also ends in two of them, which the window holds.
_END_WINDOW = 16


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Rule-based sentence split as (start, end) character spans; abbreviations and initials stay inside.

    Each boundary looks at most ``_END_WINDOW`` characters back (a word boundary still sees the character
    before the window), so a text costs time linear in its length; testing whole prefixes was quadratic.
    """
    starts = [0]
    for m in _BOUNDARY.finditer(text):
        end = m.start() + len(m.group().rstrip())  # the piece before the cut, without the cut's whitespace
        if not _NOT_AN_END.search(text, max(0, end - _END_WINDOW), end):
            starts.append(m.end())
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
