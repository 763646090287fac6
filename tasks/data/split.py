"""Splitting a document into passages of at most ``max_tokens`` tokens of the embedder's own tokenizer, each with
its lineage: the character span it was cut from, the PDF page it starts on, the heading path above it.

Cuts fall on the coarsest boundary that fits: a Markdown heading (``#`` before ``##``), then a paragraph (a blank
line), a line, a sentence, a word, and only inside a word when one word alone is longer than a passage. Each
passage packs as many units of that level as fit, and starts again up to ``overlap`` tokens before the previous
cut, on the coarsest boundary in that window.

Tokens are counted from **one pass** of the model's ``tokenizer.json`` (``tokenizers``, what the encoder tokenizes
with, special tokens not counted) over the whole document. This is exact for the WordPiece models of
sentence-transformers (MiniLM, BGE, E5, ...): BERT's pre-tokenizer splits on whitespace and punctuation before
WordPiece sees a word, so a span cut at a word boundary has exactly the tokens of the whole text's pass that lie
in it (tests/tasks/data/test_split.py checks this against the real tokenizer). A cut inside a word (only when one
word is longer than ``max_tokens``) is re-counted with the tokenizer. A model whose tokenizer is not BERT's
(byte-level BPE, SentencePiece) is split by ``semantic-text-splitter`` instead, which counts every candidate
with the tokenizer (about 6x slower than this cut: docs/own-documents.md).

Why not a library for the common case: ``semantic-text-splitter`` (Rust) cuts the same hierarchy but tokenizes
each candidate chunk again and again (binary search over units): 96 s/MB against 16 s/MB for this cut and 11 s/MB
for one tokenizer pass on the installed packages' descriptions (a loaded box); ``semchunk`` knows no Markdown
headings (measured side by side in docs/own-documents.md). Beyond the papers: the papers cut fixed windows
(LinearRAG, EraRAG) or sentences (ZoomRAG); this is the usual structure-aware variant, labelled as such in
conf/dataset.
"""
from __future__ import annotations

import bisect
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tasks.data.readers import ReadDocument


@dataclass(frozen=True)
class Piece:
    """One passage of a document: ``text[start:end]``, its 1-based PDF page (None: not a PDF) and heading path."""

    start: int
    end: int
    page: int | None
    headings: list[str]


@functools.lru_cache(maxsize=4)
def tokenizer(model_folder: str) -> Any:
    """The model's ``tokenizer.json`` (``tokenizers``), without truncation or padding, to count tokens."""
    from tokenizers import Tokenizer

    path = Path(model_folder) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {model_folder}: dataset.split counts tokens with the "
                                f"embedder's tokenizer; set embedder.model to a local sentence-transformers folder")
    tok = Tokenizer.from_file(str(path))
    tok.no_truncation()
    tok.no_padding()
    return tok


@functools.lru_cache(maxsize=8)
def _splitter(model_folder: str, markdown: bool, max_tokens: int, overlap: int) -> Any:
    from semantic_text_splitter import MarkdownSplitter, TextSplitter

    cls = MarkdownSplitter if markdown else TextSplitter
    return cls.from_huggingface_tokenizer(tokenizer(model_folder), max_tokens, overlap=overlap, trim=True)


def markdown_headings(text: str) -> list[tuple[int, int, str]]:
    """``(char offset, level, title)`` of each Markdown heading (ATX or setext; ``#`` inside code is not one)."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(text)
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    out = []
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tok.map:
            title = " ".join(tokens[i + 1].content.split()) if i + 1 < len(tokens) else ""
            out.append((line_starts[tok.map[0]], int(tok.tag[1]), title))
    return out


def heading_path(headings: list[tuple[int, int, str]], at: int) -> list[str]:
    """The headings enclosing offset ``at`` (those at or before it, each closing the deeper ones before it)."""
    stack: list[tuple[int, str]] = []
    for offset, level, title in headings:
        if offset > at:
            break
        while stack and stack[-1][0] >= level:
            stack.pop()
        stack.append((level, title))
    return [t for _, t in stack if t]


def whole_span(text: str) -> tuple[int, int]:
    """The span of a whole text without its leading and trailing whitespace."""
    return len(text) - len(text.lstrip()), len(text.rstrip())


def count_tokens(model_folder: str, text: str) -> int:
    """Tokens of ``text`` under the model's tokenizer, special tokens not counted."""
    return len(tokenizer(model_folder).encode(text, add_special_tokens=False).ids)


# unit boundaries, coarse to fine after the headings: the offset where the next unit starts
PARAGRAPH = re.compile(r"\n[^\S\n]*\n\s*")
LINE = re.compile(r"\n\s*")
SENTENCE = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]]*\s+")
WHITESPACE = np.array([c for c in range(0x3001) if chr(c).isspace()], dtype=np.uint32)


def unit_starts(pattern: re.Pattern[str], text: str) -> np.ndarray:
    """The sorted offsets where ``pattern``'s matches end (where the unit after each boundary starts)."""
    return np.fromiter((m.end() for m in pattern.finditer(text)), dtype=np.int64)


def cut_levels(text: str, token_starts: np.ndarray, word_starts: np.ndarray,
               headings: list[tuple[int, int, str]]) -> list[np.ndarray]:
    """Candidate cut offsets per level, coarsest first: headings by level, paragraphs, lines, sentences, words
    (a token after whitespace), then every token that starts a pre-token (punctuation: ``word_starts``), then
    every token (inside a word)."""
    levels = [np.array(sorted({o for o, lv, _ in headings if lv == k}), dtype=np.int64) for k in range(1, 7)]
    # a heading stays with what follows it: the line after a heading is no cut
    after_heading = np.array([m.end() for m in (LINE.search(text, o) for o, _, _ in headings) if m],
                             dtype=np.int64)
    codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    after_space = np.isin(codepoints[np.maximum(token_starts - 1, 0)], WHITESPACE) | (token_starts == 0)
    blocks = [np.setdiff1d(unit_starts(p, text), after_heading) for p in (PARAGRAPH, LINE)]
    levels = [lv for lv in levels if len(lv)] + blocks + [unit_starts(SENTENCE, text), token_starts[after_space]]
    return levels + [word_starts, token_starts]


def _last_in(levels: list[np.ndarray], lo: int, hi: int) -> int:
    """The furthest offset in ``(lo, hi]`` of the coarsest level that has one."""
    for lv in levels:
        i = int(np.searchsorted(lv, hi, side="right")) - 1
        if i >= 0 and lv[i] > lo:
            return int(lv[i])
    raise ValueError(f"no cut offset in ({lo}, {hi}]")


def _first_in(levels: list[np.ndarray], lo: int, hi: int) -> int:
    """The earliest offset in ``[lo, hi)`` of the coarsest level that has one (``hi`` when none has)."""
    for lv in levels:
        i = int(np.searchsorted(lv, lo, side="left"))
        if i < len(lv) and lv[i] < hi:
            return int(lv[i])
    return hi


def pack_spans(levels: list[np.ndarray], token_starts: np.ndarray, n_chars: int, max_tokens: int,
               overlap: int) -> list[tuple[int, int]]:
    """``[start, end)`` spans of at most ``max_tokens`` tokens (a span holds the tokens starting inside it), each
    ending on the coarsest boundary that fits and starting up to ``overlap`` tokens before the previous end."""
    n = len(token_starts)
    spans: list[tuple[int, int]] = []
    first, prev_end = 0, 0
    while first < n:
        start = int(token_starts[first])
        if first + max_tokens >= n:
            spans.append((start, n_chars))
            break
        end = _last_in(levels, max(start, prev_end), int(token_starts[first + max_tokens]))
        spans.append((start, end))
        after = int(np.searchsorted(token_starts, end, side="left"))
        window = int(token_starts[max(after - overlap, first + 1)]) if overlap else end
        first, prev_end = int(np.searchsorted(token_starts, _first_in(levels, window, end), side="left")), end
    return spans


@functools.lru_cache(maxsize=4)
def bert_pretokenized(model_folder: str) -> bool:
    """Whether the model's tokenizer is BERT's WordPiece behind BERT's pre-tokenizer (one pass counts any span
    cut at a word boundary)."""
    spec = json.loads(tokenizer(model_folder).to_str())
    return (spec.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer" and \
        spec["model"].get("type") == "WordPiece"


def _fit(tok: Any, text: str, start: int, end: int, max_tokens: int) -> int:
    """``end`` pulled back until ``text[start:end]`` has at most ``max_tokens`` tokens (a cut inside a word)."""
    enc = tok.encode(text[start:end], add_special_tokens=False)
    if len(enc.ids) <= max_tokens:
        return end
    return start + enc.offsets[max_tokens - 1][1]


def split_document(doc: ReadDocument, model_folder: str, max_tokens: int, overlap: int) -> list[Piece]:
    """``doc`` cut into passages of at most ``max_tokens`` tokens with up to ``overlap`` tokens shared by
    neighbours; a document that fits is one passage, its whole text."""
    headings = markdown_headings(doc.text) if doc.markdown else []

    def piece(start: int, end: int) -> Piece:
        page = bisect.bisect_right(doc.page_starts, start) if doc.page_starts else None
        return Piece(start, end, page, heading_path(headings, start))

    tok = tokenizer(model_folder)
    overlap = min(overlap, max_tokens - 1)
    if not bert_pretokenized(model_folder):
        if count_tokens(model_folder, doc.text) <= max_tokens:
            return [piece(*whole_span(doc.text))]
        chunks = _splitter(model_folder, doc.markdown, max_tokens, overlap).chunk_indices(doc.text)
        return [piece(start, start + len(chunk)) for start, chunk in chunks if chunk.strip()]
    enc = tok.encode(doc.text, add_special_tokens=False)
    if len(enc.ids) <= max_tokens:
        return [piece(*whole_span(doc.text))]
    n = len(enc.ids)
    token_starts = np.fromiter((o[0] for o in enc.offsets), dtype=np.int64, count=n)
    words = np.array(enc.word_ids, dtype=np.int64)
    pre_token = np.r_[True, words[1:] != words[:-1]]  # the first token of each pre-token (word or punctuation)
    levels = cut_levels(doc.text, token_starts, token_starts[pre_token], headings)
    inside_word = set(token_starts[~pre_token].tolist())
    out = []
    for start, end in pack_spans(levels, token_starts, len(doc.text), max_tokens, overlap):
        if start in inside_word or end in inside_word:
            end = _fit(tok, doc.text, start, end, max_tokens)
        end = start + len(doc.text[start:end].rstrip())
        if end > start:
            out.append(piece(start, end))
    return out
