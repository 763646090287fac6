"""EraRAG DAG (paper section III, Fig. 3): documents → window chunks (leaves) → embeddings →
stored hyperplanes → LSH hierarchy (Alg. 1; Alg. 3 under ``flows.commands.update``).

Online: Alg. 2 over all layers (collapsed, or biased with ``detail_proportion``) for the reader's
context; documents ranked by the leaves (default) or expanded view of the retrieved nodes.
"""
from __future__ import annotations

from flows.methods import Method
from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef
from tasks.methods.erarag.retriever import EraRetriever
from tasks.methods.erarag.params import EraParams, HyperplanesParams, LeavesParams, hierarchy_params
from tasks.methods.erarag.stages import hierarchy_stage, hyperplanes_stage, leaves_stage, update_summary
from tasks.text.chunk import ChunkParams, chunk
from tasks.text.embed import EmbedParams, embed


def _dag(ctx: RunContext, data: dict[str, ArtifactRef], cfg, incremental: bool) -> dict[str, ArtifactRef]:
    """EraRAG's index stages (``incremental``: Alg. 3 from the latest stored hierarchy)."""
    documents = data["documents"]
    chunks = chunk(ctx, ChunkParams.of(cfg, unit="window"), documents)["chunks"]  # leaves: token windows
    leaves = leaves_stage(ctx, LeavesParams.of(cfg), documents, chunks)["leaves"]
    leaf_embeddings = embed(ctx, EmbedParams.of(cfg, id_col="chunk_id", use_template=True), leaves)["embeddings"]
    planes = hyperplanes_stage(ctx, HyperplanesParams.of(cfg), leaf_embeddings)["hyperplanes"]
    graph = hierarchy_stage(ctx, hierarchy_params(cfg), leaves, leaf_embeddings, planes, cfg.llm, incremental)
    return {"chunks": chunks, "leaves": leaves, "leaf_embeddings": leaf_embeddings, "hyperplanes": planes, **graph}


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=erarag``: a full build (Alg. 1) of any corpus not stored yet."""
    return _dag(ctx, data, cfg, incremental=False)


def update(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """``flows.commands.update``: the same stages, the hierarchy updated from the latest stored one (Alg. 3)."""
    return _dag(ctx, data, cfg, incremental=True)


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> EraRetriever:
    """Online side of ``method=erarag``."""
    return EraRetriever(data, index, cfg.method, cfg.embedder, tuple(cfg.eval.ks))


METHOD = Method("erarag", EraParams, index, retriever, disk_bytes_per_passage=3_700, update=update,
                update_summary=update_summary)
