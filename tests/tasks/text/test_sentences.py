"""Tests for ``tasks.text.sentences``: the one sentence splitter."""
from __future__ import annotations

import pytest

from tasks.text.sentences import sentence_spans, split_sentences


@pytest.mark.parametrize("text, expected", [
    ("Dr. Smith went home. He slept.", ["Dr. Smith went home.", "He slept."]),
    ("J. R. R. Tolkien wrote books. They sold well.", ["J. R. R. Tolkien wrote books.", "They sold well."]),
    ("He joined the U.S. Army in 1942. It was cold.", ["He joined the U.S. Army in 1942.", "It was cold."]),
    ("Pi is about 3.14 today. The rate rose 2.5 times.", ["Pi is about 3.14 today.", "The rate rose 2.5 times."]),
    ("Mr. and Mrs. Jones met Prof. Xu at St. Mary in Jan. 1990. They talked.",
     ["Mr. and Mrs. Jones met Prof. Xu at St. Mary in Jan. 1990.", "They talked."]),
    ("Is it? Yes! It is.", ["Is it?", "Yes!", "It is."]),
    ('He said "Go home." Then he left.', ['He said "Go home."', "Then he left."]),
    ("It was 1990. 2001 came later.", ["It was 1990.", "2001 came later."]),
    ("  Leading space.  Trailing too.  ", ["Leading space.", "Trailing too."]),
    ("A line.\nAnother line.", ["A line.", "Another line."]),
    ("no end punctuation at all", ["no end punctuation at all"]),
    ("lower case after a stop. stays together", ["lower case after a stop. stays together"]),
    ("", []),
])
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_split_sentences_loses_no_words():
    text = ("Dr. J. Doe of the U.S. Navy arrived at 3.30 p.m. on Jan. 5. She left! Did she return? "
            "No. Inc. reports vary, etc. The end.")
    assert " ".join(split_sentences(text)).split() == text.split()


def test_sentence_spans_index_the_text():
    text = "  Mr. Lee left. He came back!  Then, at 5 p.m., he slept.  "
    spans = sentence_spans(text)
    assert [text[a:b] for a, b in spans] == split_sentences(text)
    assert split_sentences(text) == ["Mr. Lee left.", "He came back!", "Then, at 5 p.m., he slept."]
    assert all(a < b for a, b in spans) and all(b <= c for (_, b), (c, _) in zip(spans, spans[1:]))


def _whole_prefix_spans(text: str) -> list[tuple[int, int]]:
    """The rule as first written: every cut tested against the whole text before it (quadratic)."""
    from tasks.text.sentences import _BOUNDARY, _NOT_AN_END

    cuts = [m.end() for m in _BOUNDARY.finditer(text)]
    starts = [0] + [c for c in cuts if not _NOT_AN_END.search(text[:c].rstrip())]
    spans = []
    for a, b in zip(starts, starts[1:] + [len(text)]):
        piece = text[a:b]
        lead, trail = len(piece) - len(piece.lstrip()), len(piece.rstrip())
        if trail > lead:
            spans.append((a + lead, a + trail))
    return spans


def test_looking_back_a_window_splits_exactly_like_testing_the_whole_prefix():
    import random

    # words that end a sentence, words that only look like it, and words whose \b context lies before the window
    words = ["Dr.", "dr.", "J.", "j.", "U.S.A.", "A.B.C.D.E.F.G.H.I.J.K.", "approx.", "xapprox.", "Sept.", "Sept",
             "ABS.", "zU.S.", "end.", "Yes!", "Is?", '"Go."', "(x.)", "3.14", "1990.", "etc.", "p.m.", "Mt.", "No.",
             "Word", "word", "2001", "'Quote", "[Br]", "…", "Étude.", "é."]
    rng = random.Random(0)
    for _ in range(3000):
        gaps = [" ", " ", "  ", "\n", "\t ", ""]
        text = "".join(rng.choice(words) + rng.choice(gaps) for _ in range(rng.randint(0, 25)))
        assert sentence_spans(text) == _whole_prefix_spans(text), text
