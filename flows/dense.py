"""Dense baseline DAG: documents → embed → (faiss inner-product index, built on load)."""
from __future__ import annotations

from tasks.dense import DenseParams, DenseRetriever
from tasks.embed import embed
from tasks.stage import RunContext
from tasks.store import ArtifactRef

__all__ = ["DenseParams", "index", "retriever"]


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=dense``."""
    doc_embeddings = embed(ctx, data["documents"], "doc_id", cfg.embedder, use_template=True)["embeddings"]
    return {"doc_embeddings": doc_embeddings}


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> DenseRetriever:
    """Online side of ``method=dense``."""
    return DenseRetriever(index["doc_embeddings"], cfg.embedder)
