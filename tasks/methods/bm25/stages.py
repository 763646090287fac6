"""Lexical baseline: BM25 with bm25s (sparse score matrix, English stopwords)."""
from __future__ import annotations

import io
import logging
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import bm25s
import numpy as np

from tasks.core.stage import RunContext, StageParams, input_fps, run_stage, stage
from tasks.core.store import ArtifactRef
from tasks.eval.retrieve import Hits
from tasks.text.embed import render_texts
from tasks.core.limits import COUNT, COUNT0, PROB

logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG when imported


@dataclass(frozen=True)
class BM25Params:
    """``method=bm25``: Lucene-variant BM25; passages indexed as ``doc_template`` renders them."""

    name: str = "bm25"
    k1: float = field(default=1.5, metadata=COUNT0)
    b: float = field(default=0.75, metadata=PROB)
    stopwords: str = "en"
    doc_template: str = "{title}\n{text}"
    top_k: int = field(default=10, metadata=COUNT)
    batch_size: int = field(default=256, metadata=COUNT)


@dataclass(frozen=True)
class BM25IndexParams(StageParams):
    """The BM25 index's keys (``method=bm25`` and ``method=hybrid`` share an index when they are equal)."""

    SOURCES = ("method",)
    k1: float
    b: float
    stopwords: str
    doc_template: str


def build_bm25(texts: list[str], params: BM25IndexParams) -> bm25s.BM25:
    """Tokenise and index a corpus."""
    tokens = bm25s.tokenize(texts, stopwords=params.stopwords, show_progress=False)
    model = bm25s.BM25(k1=params.k1, b=params.b)
    model.index(tokens, show_progress=False)
    return model


def pack(model: bm25s.BM25) -> bytes:
    """A bm25s index folder as one tar blob (so it can be written atomically)."""
    with tempfile.TemporaryDirectory() as tmp:
        model.save(tmp, show_progress=False)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for f in sorted(Path(tmp).iterdir()):
                tar.add(f, arcname=f.name)
        return buf.getvalue()


def unpack(blob: bytes) -> bm25s.BM25:
    """Load an index written by :func:`pack`."""
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(tmp, filter="data")
        return bm25s.BM25.load(tmp, show_progress=False, verbosity=0)


@stage("bm25_index", params=BM25IndexParams)
def bm25_index(ctx: RunContext, params: BM25IndexParams, documents: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: the BM25 index of the corpus (a global structure, rebuilt from ``documents``)."""
    def compute() -> tuple[dict[str, bytes], int]:
        docs = ctx.store.read(documents, ["title", "text"])
        return {"bm25": pack(build_bm25(render_texts(docs, params.doc_template), params))}, len(docs)

    return run_stage(ctx, params, input_fps(documents=documents), compute, ext={"bm25": "tar"})


class BM25Retriever:
    """Online side of ``method=bm25``."""

    def __init__(self, documents: ArtifactRef, index: ArtifactRef, params: BM25Params) -> None:
        from tasks.core.store import Store

        self.doc_ids = np.asarray(Store.read(documents, ["doc_id"])["doc_id"].tolist(), dtype=object)
        self.model = unpack(Store.read_bytes(index))  # checked against its recorded hash
        self.params = params

    def search(self, questions: list[str], k: int) -> Hits:
        """Top-k passages by BM25 score."""
        t0 = time.perf_counter()
        tokens = bm25s.tokenize(questions, stopwords=self.params.stopwords, show_progress=False)
        t1 = time.perf_counter()
        idx, scores = self.model.retrieve(tokens, k=min(k, len(self.doc_ids)), show_progress=False, n_threads=1)
        t2 = time.perf_counter()
        idx = np.where(scores > 0, idx, -1)  # a passage sharing no query term is not retrieved
        return Hits(idx.astype(np.int64), scores, {"query_tokenize": t1 - t0, "search": t2 - t1})
