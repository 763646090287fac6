"""BM25 baseline's index stage: the bm25s index of the corpus, stored as one tar blob."""
from __future__ import annotations

import io
import logging
import tarfile
import tempfile
from pathlib import Path

import bm25s

from tasks.core.stage import RunContext, input_fps, run_stage, stage
from tasks.core.store import ArtifactRef
from tasks.text.embed import render_texts
from tasks.methods.bm25.params import BM25IndexParams
from tasks.methods.bm25.algorithm import build_bm25

logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG when imported


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
