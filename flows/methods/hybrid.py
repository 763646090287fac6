"""Hybrid baseline DAG: documents → (embed, bm25_index), the very stages of ``dense`` and ``bm25``.

Online: dense and BM25 top lists of the batch → reciprocal-rank fusion. It has no index stage of its own, so
with dense and bm25 built it indexes nothing.
"""
from __future__ import annotations

from flows.methods import Method
from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef
from tasks.methods.hybrid.params import HybridParams
from tasks.methods.hybrid.retriever import HybridRetriever
from tasks.methods.hybrid.stages import BM25IndexParams, EmbedParams, bm25_index, embed  # dense's and bm25's


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=hybrid``."""
    passages = EmbedParams.of(cfg, id_col="doc_id", use_template=True)  # title + text, as every method embeds them
    doc_embeddings = embed(ctx, passages, data["documents"])["embeddings"]
    bm25 = bm25_index(ctx, BM25IndexParams.of(cfg), data["documents"])["bm25"]
    return {"doc_embeddings": doc_embeddings, "bm25": bm25}


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> HybridRetriever:
    """Online side of ``method=hybrid``."""
    return HybridRetriever(data["documents"], index["doc_embeddings"], index["bm25"], cfg.method, cfg.embedder)


METHOD = Method("hybrid", HybridParams, index, retriever, disk_bytes_per_passage=1_800)
