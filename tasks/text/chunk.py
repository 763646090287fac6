"""Chunking: documents → ordered chunks (whole passages, sentences, or token windows with overlap).

Chunks keep their position inside their document, so within-document order (ZoomRAG's temporal
distance |i − j|) is available, while nothing links chunks of *different* documents by corpus order.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa

from tasks.core.code_identity import code_version
from tasks.core.row_cache import Once
from tasks.core.stage import RunContext, StageParams, from_config, input_fps, run_row_stage, stage
from tasks.core.store import ArtifactRef, Store
from tasks.text import sentences

CHUNK_UNITS = ("passage", "sentence", "window")  # how a document is cut into chunks (ChunkParams.unit)


@dataclass(frozen=True)
class ChunkParams(StageParams):
    """How documents are cut: ``unit`` is passage | sentence | window (whitespace tokens); the chunk stage's
    params (``method.chunk_unit``, ``method.window_tokens``, ``method.overlap_tokens`` where the method has them)."""

    SOURCES = ("method",)
    unit: str = from_config("chunk_unit", "sentence")
    window_tokens: int = 1200
    overlap_tokens: int = 100

    def __post_init__(self) -> None:
        if self.unit not in CHUNK_UNITS:
            raise ValueError(f"chunk.unit must be passage, sentence or window, got {self.unit!r}")
        if self.unit == "window" and not 0 <= self.overlap_tokens < self.window_tokens:
            raise ValueError("chunk.overlap_tokens must be >= 0 and < chunk.window_tokens")


_TOKEN = re.compile(r"\S+")


def window_spans(text: str, size: int, overlap: int) -> list[tuple[int, int]]:
    """Spans of windows of ``size`` whitespace tokens, consecutive windows sharing ``overlap`` tokens."""
    toks = [(m.start(), m.end()) for m in _TOKEN.finditer(text)]
    if len(toks) <= size:
        return [(toks[0][0], toks[-1][1])] if toks else []
    starts = range(0, max(len(toks) - overlap, 1), size - overlap)
    return [(toks[s][0], toks[min(s + size, len(toks)) - 1][1]) for s in starts]


def token_windows(text: str, size: int, overlap: int) -> list[str]:
    """The texts of :func:`window_spans`."""
    return [text[a:b] for a, b in window_spans(text, size, overlap)]


def chunk_spans(text: str, params: ChunkParams) -> list[tuple[int, int]]:
    """Character spans of the chunks of one document, in order (never empty for a non-blank text)."""
    if params.unit == "sentence":
        spans = sentences.sentence_spans(text)
    elif params.unit == "window":
        spans = window_spans(text, params.window_tokens, params.overlap_tokens)
    else:
        spans = []
    return spans or [(0, len(text))]


def chunk_documents(docs: pd.DataFrame, params: ChunkParams) -> pd.DataFrame:
    """``documents(doc_id, text)`` → ``chunks(chunk_id, doc_id, position, start, end, text)``.

    ``start``/``end`` are character offsets in the document, so document-level NER mentions map
    onto chunks without running NER twice.
    """
    rows = []
    for did, text in zip(docs["doc_id"].tolist(), docs["text"].tolist()):
        for pos, (a, b) in enumerate(chunk_spans(text, params)):
            piece = text[a:b]
            cid = "chk-" + hashlib.sha1(f"{did}\x1f{pos}\x1f{piece}".encode()).hexdigest()[:16]
            rows.append((cid, did, pos, a, b, piece))
    frame = pd.DataFrame(rows, columns=["chunk_id", "doc_id", "position", "start", "end", "text"])
    return frame.astype({"position": "int32", "start": "int32", "end": "int32"})


@stage("chunk", params=ChunkParams)
def chunk(ctx: RunContext, params: ChunkParams, documents: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: chunk every document not chunked before with these params (row-incremental by doc_id)."""
    @Once
    def read() -> pd.DataFrame:  # only when the stage computes (tasks.core.stage.run_named_row_stage)
        return Store.read(documents, ["doc_id", "text"])

    def compute_rows(missing: list[str]) -> pa.Table:
        docs = read()
        todo = docs[docs["doc_id"].isin(set(missing))].drop_duplicates("doc_id")
        return pa.Table.from_pandas(chunk_documents(todo, params), preserve_index=False)

    def assemble(rows: pa.Table | None) -> dict[str, pa.Table]:
        docs = read()
        table = rows.to_pandas() if rows is not None else chunk_documents(docs.iloc[:0], params)
        order = {d: i for i, d in enumerate(docs["doc_id"].tolist())}
        table["_o"] = table["doc_id"].map(order)
        table = table.sort_values(["_o", "position"], kind="stable").drop(columns="_o").reset_index(drop=True)
        return {"chunks": table}

    row_params = {"params": params.identity(), "code": code_version(chunk_documents)}  # a row: its document's chunks
    return run_row_stage(ctx, params, row_params, input_fps(documents=documents), lambda: read()["doc_id"],
                         compute_rows, "doc_id", assemble)
