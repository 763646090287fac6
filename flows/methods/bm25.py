"""BM25 baseline DAG: documents → bm25_index."""
from __future__ import annotations

from flows.methods import Method
from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef
from tasks.methods.bm25.params import BM25IndexParams, BM25Params
from tasks.methods.bm25.retriever import BM25Retriever
from tasks.methods.bm25.stages import bm25_index


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=bm25``."""
    return {"bm25": bm25_index(ctx, BM25IndexParams.of(cfg), data["documents"])["bm25"]}


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> BM25Retriever:
    """Online side of ``method=bm25``."""
    return BM25Retriever(data["documents"], index["bm25"], cfg.method)


METHOD = Method("bm25", BM25Params, index, retriever, disk_bytes_per_passage=300, embeds=False)
