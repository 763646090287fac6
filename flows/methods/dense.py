"""Dense baseline DAG: documents → embed → (faiss inner-product index, built on load)."""
from __future__ import annotations

from flows.methods import Method
from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef
from tasks.methods.dense.params import DenseParams
from tasks.methods.dense.retriever import DenseRetriever
from tasks.methods.dense.stages import EmbedParams, embed  # the shared passage embeddings


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=dense``."""
    passages = EmbedParams.of(cfg, id_col="doc_id", use_template=True)  # title + text, as every method embeds them
    doc_embeddings = embed(ctx, passages, data["documents"])["embeddings"]
    return {"doc_embeddings": doc_embeddings}


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> DenseRetriever:
    """Online side of ``method=dense``."""
    return DenseRetriever(index["doc_embeddings"], cfg.embedder)


METHOD = Method("dense", DenseParams, index, retriever, disk_bytes_per_passage=1_600)
