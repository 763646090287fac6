"""Tests for ``tasks.text.chunk``: token windows, chunk tables and the row-incremental stage."""
from __future__ import annotations

import pandas as pd
import pytest

from tasks.core.stage import RunContext
from tasks.core.files import write_parquet
from tasks.core.hashing import short_hash
from tasks.core.store import ArtifactRef
from tasks.text.chunk import (
    ChunkParams,
    chunk,
    chunk_documents,
    token_windows,
)

# ----------------------------------------------------------------------------- token_windows

def _toks(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def test_token_windows_known_cases():
    assert token_windows(_toks(10), 4, 1) == ["w0 w1 w2 w3", "w3 w4 w5 w6", "w6 w7 w8 w9"]
    assert token_windows(_toks(10), 4, 0) == ["w0 w1 w2 w3", "w4 w5 w6 w7", "w8 w9"]
    assert token_windows(_toks(5), 3, 2) == ["w0 w1 w2", "w1 w2 w3", "w2 w3 w4"]
    assert token_windows(_toks(3), 5, 2) == ["w0 w1 w2"]     # short text: one window
    assert token_windows(_toks(4), 4, 1) == ["w0 w1 w2 w3"]  # exactly one window's worth
    assert token_windows("", 4, 1) == [] and token_windows("   ", 4, 1) == []


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 23, 50])
@pytest.mark.parametrize("size, overlap", [(1, 0), (3, 0), (3, 1), (3, 2), (8, 3), (10, 9)])
def test_token_windows_cover_and_overlap(n, size, overlap):
    windows = [w.split() for w in token_windows(_toks(n), size, overlap)]
    idx = [[int(t[1:]) for t in w] for w in windows]
    assert all(1 <= len(w) <= size for w in idx)
    assert all(w == list(range(w[0], w[0] + len(w))) for w in idx)  # contiguous runs of tokens
    assert sorted(set().union(*map(set, idx))) == list(range(n))     # every token covered
    assert idx[0][0] == 0 and idx[-1][-1] == n - 1
    for a, b in zip(idx, idx[1:]):
        assert len(a) == size                               # only the last window may be short
        assert len(set(a) & set(b)) == overlap              # consecutive windows share `overlap` tokens
        assert b[-1] > a[-1]                                # no window is contained in the previous one


# ----------------------------------------------------------------------------- chunk_documents

def test_chunk_params_validation():
    with pytest.raises(ValueError):
        ChunkParams(unit="paragraph")
    with pytest.raises(ValueError):
        ChunkParams(unit="window", window_tokens=5, overlap_tokens=5)
    ChunkParams(unit="passage", window_tokens=5, overlap_tokens=5)  # window sizes matter only for windows


DOCS = pd.DataFrame({"doc_id": ["d1", "d2", "d3", "d4"],
                     "text": ["First one. Second one. Third one.", "Only one sentence", "Same. Text.",
                              "Same. Text."]})


@pytest.mark.parametrize("params, counts", [
    (ChunkParams(unit="sentence"), [3, 1, 2, 2]),
    (ChunkParams(unit="passage"), [1, 1, 1, 1]),
    (ChunkParams(unit="window", window_tokens=2, overlap_tokens=0), [3, 2, 1, 1]),
])
def test_chunk_documents_positions_and_ids(params, counts):
    chunks = chunk_documents(DOCS, params)
    assert {"chunk_id", "doc_id", "position", "text"} <= set(chunks.columns)
    assert chunks.groupby("doc_id", sort=False).size().tolist() == counts
    assert chunks["doc_id"].tolist() == [d for d, c in zip(DOCS["doc_id"], counts) for _ in range(c)]
    for _, g in chunks.groupby("doc_id"):
        assert g["position"].tolist() == list(range(len(g)))
    assert chunks["chunk_id"].is_unique  # same text in two documents: distinct chunk ids
    assert chunks["chunk_id"].str.startswith("chk-").all()
    again = chunk_documents(DOCS.iloc[::-1].reset_index(drop=True), params)
    assert dict(zip(again["chunk_id"], again["text"])) == dict(zip(chunks["chunk_id"], chunks["text"]))
    if {"start", "end"} <= set(chunks.columns):  # character spans, where the table carries them
        texts = dict(zip(DOCS["doc_id"], DOCS["text"]))
        assert all(texts[r.doc_id][r.start:r.end] == r.text for r in chunks.itertuples())


def test_chunk_documents_sentence_texts():
    chunks = chunk_documents(DOCS.iloc[:1], ChunkParams(unit="sentence"))
    assert chunks["text"].tolist() == ["First one.", "Second one.", "Third one."]
    assert chunk_documents(DOCS.iloc[:0], ChunkParams()).empty


# ----------------------------------------------------------------------------- the row-incremental stage

def _corpus(n: int) -> pd.DataFrame:
    return pd.DataFrame({"doc_id": [f"doc-{i:03d}" for i in range(n)], "title": [f"T{i}" for i in range(n)],
                         "text": [f"Doc {i} starts here. It has {i % 3 + 1} parts. Dr. No said so." for i in range(n)]})


def _documents_ref(ctx: RunContext, docs: pd.DataFrame) -> ArtifactRef:
    fp = short_hash(docs["doc_id"].tolist())
    path = ctx.store.path_for(ctx.dataset, "ingest", "documents", fp)
    rows = write_parquet(docs, path)
    return ArtifactRef("documents", str(path), fp, rows)


def _rows_computed(ctx: RunContext, ref: ArtifactRef) -> int:
    return int(ctx.store.query("SELECT rows_computed FROM stages WHERE stage = 'chunk' AND fp = ?",
                               [ref.fp])["rows_computed"].iloc[0])


def _check(out: pd.DataFrame, docs: pd.DataFrame, params: ChunkParams) -> None:
    expected = chunk_documents(docs, params)
    cols = ["chunk_id", "doc_id", "position", "text"]
    pd.testing.assert_frame_equal(out[cols].reset_index(drop=True), expected[cols].reset_index(drop=True),
                                  check_dtype=False)


def test_chunk_stage_is_row_incremental(ctx):
    params = ChunkParams(unit="sentence")
    full = _corpus(12)
    ten = full.iloc[[0, 1, 2, 3, 5, 6, 7, 8, 10, 11]].reset_index(drop=True)

    first = chunk.fn(ctx, params, _documents_ref(ctx, ten))["chunks"]
    assert _rows_computed(ctx, first) == 10
    _check(ctx.store.read(first), ten, params)

    # a superset (new docs in the middle): only the 2 new docs are chunked, output in input order
    second = chunk.fn(ctx, params, _documents_ref(ctx, full))["chunks"]
    assert second.fp != first.fp
    assert _rows_computed(ctx, second) == 2
    _check(ctx.store.read(second), full, params)

    # a shrunk, reordered corpus: nothing computed, only the current docs in the output
    small = full.iloc[[9, 4, 0]].reset_index(drop=True)
    third = chunk.fn(ctx, params, _documents_ref(ctx, small))["chunks"]
    assert _rows_computed(ctx, third) == 0
    out = ctx.store.read(third)
    assert list(dict.fromkeys(out["doc_id"])) == ["doc-009", "doc-004", "doc-000"]
    _check(out, small, params)

    # the same input again is a whole-stage cache hit
    assert chunk.fn(ctx, params, _documents_ref(ctx, small))["chunks"] == third
    assert ctx.store.events("run1")["status"].tolist() == ["computed"] * 3 + ["cached"]

    # other chunk params: a separate row cache, everything computed
    windows = ChunkParams(unit="window", window_tokens=4, overlap_tokens=1)
    fourth = chunk.fn(ctx, windows, _documents_ref(ctx, small))["chunks"]
    assert _rows_computed(ctx, fourth) == 3
    _check(ctx.store.read(fourth), small, windows)
