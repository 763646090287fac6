"""EraRAG DAG (paper section III, Fig. 3): documents → window chunks (leaves) → embeddings →
stored hyperplanes → LSH hierarchy (Alg. 1; Alg. 3 under ``flows.update``).

Online: Alg. 2 over all layers (collapsed, or biased with ``detail_proportion``) for the reader's
context; documents ranked by the leaves (default) or expanded view of the retrieved nodes.
"""
from __future__ import annotations

from flows.methods import Method
from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef
from tasks.methods.erarag.retriever import EraRetriever
from tasks.methods.erarag.stages import (
    EraParams,
    hierarchy_stage,
    hyperplanes_stage,
    leaves_stage,
    update_summary,
)
from tasks.text.chunk import chunk
from tasks.text.embed import embed


def _dag(ctx: RunContext, data: dict[str, ArtifactRef], cfg, incremental: bool) -> dict[str, ArtifactRef]:
    p, documents = cfg.method, data["documents"]
    chunks = chunk(ctx, documents, p.chunking())["chunks"]
    leaves = leaves_stage(ctx, documents, chunks)["leaves"]
    leaf_embeddings = embed(ctx, leaves, "chunk_id", cfg.embedder, use_template=True)["embeddings"]
    planes = hyperplanes_stage(ctx, leaf_embeddings, p)["hyperplanes"]
    graph = hierarchy_stage(ctx, leaves, leaf_embeddings, planes, p, cfg.llm, cfg.embedder, incremental)
    return {"chunks": chunks, "leaves": leaves, "leaf_embeddings": leaf_embeddings, "hyperplanes": planes, **graph}


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=erarag``: a full build (Alg. 1) of any corpus not stored yet."""
    return _dag(ctx, data, cfg, incremental=False)


def update(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """``flows.update``: the same stages, the hierarchy updated from the latest stored one (Alg. 3)."""
    return _dag(ctx, data, cfg, incremental=True)


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> EraRetriever:
    """Online side of ``method=erarag``."""
    return EraRetriever(data, index, cfg)


METHOD = Method("erarag", EraParams, index, retriever, disk_bytes_per_passage=3_700, update=update,
                update_summary=update_summary)
