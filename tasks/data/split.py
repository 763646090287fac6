"""Splitting a document into passages of at most ``max_tokens`` tokens of the embedder's own tokenizer, each with
its lineage: the character span it was cut from, the PDF page it starts on, the heading path above it.

The splitter is ``semantic-text-splitter`` (Rust; measured in docs/own-documents.md): it packs the largest
semantic units that fit, so a cut falls on a heading before a paragraph, a paragraph before a sentence, a sentence
before a word (its ``MarkdownSplitter`` for Markdown and HTML, ``TextSplitter`` for the rest), and it returns each
chunk's character offset, so ``text[start:end] == passage`` holds exactly. Tokens are counted with the model's
``tokenizer.json`` through ``tokenizers`` (what the encoder tokenizes with), the special tokens not counted.
Beyond the papers: the papers cut fixed windows (LinearRAG, EraRAG) or sentences (ZoomRAG); this is the usual
structure-aware variant, labelled as such in conf/dataset.
"""
from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    line_starts = [0]
    for i, ch in enumerate(text):
        if ch == "\n":
            line_starts.append(i + 1)
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


def split_document(doc: ReadDocument, model_folder: str, max_tokens: int, overlap: int) -> list[Piece]:
    """``doc`` cut into passages of at most ``max_tokens`` tokens with ``overlap`` tokens shared by neighbours;
    a document that fits is one passage, its whole text."""
    headings = markdown_headings(doc.text) if doc.markdown else []

    def piece(start: int, end: int) -> Piece:
        page = bisect.bisect_right(doc.page_starts, start) if doc.page_starts else None
        return Piece(start, end, page, heading_path(headings, start))

    if count_tokens(model_folder, doc.text) <= max_tokens:
        return [piece(*whole_span(doc.text))]
    chunks = _splitter(model_folder, doc.markdown, max_tokens, min(overlap, max_tokens - 1)).chunk_indices(doc.text)
    return [piece(start, start + len(chunk)) for start, chunk in chunks if chunk.strip()]
