"""ArchRAG DAG (paper 002, Fig. 2): passages → chunks → knowledge graph (``kg=llm``, the paper's; or the
LLM-free ``kg=cooccur``) → entity attributes → attributed communities layer by layer with a summary each
(Algorithm 1) → C-HNSW over entities and every community layer (§3.1.3).

Online (§3.2): encode → hierarchical search, k per layer → passages by the harness's rule (recall@k); with
an LLM, adaptive filtering-based generation over the retrieved items (eqs. 3–4).
"""
from __future__ import annotations

from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef
from tasks.methods.archrag.kg_stages import archrag_kg
from tasks.methods.archrag.retriever import ArchRetriever, answer
from tasks.methods.archrag.stages import (
    ArchParams,
    CHNSWBuildParams,
    EntityAttributeTextsParams,
    chnsw_stage,
    entity_texts_stage,
    hierarchy_params,
    hierarchy_stage,
)
from tasks.text.chunk import ChunkParams, chunk
from tasks.text.embed import EmbedParams, embed
from tasks.text.ner import ner

__all__ = ["ArchParams", "answer", "index", "retriever"]


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=archrag``; ``flows.update`` runs the same ones (per-chunk stages are
    row-incremental, communities are recomputed, unchanged communities keep their cached summaries)."""
    p, documents = cfg.method, data["documents"]
    chunks = chunk(ctx, ChunkParams.of(cfg), documents)["chunks"]
    mentions = ner(ctx, documents, "doc_id", cfg)["mentions"] if cfg.kg.builder == "cooccur" else None
    kg = archrag_kg(ctx, cfg, documents, chunks, mentions)
    texts = entity_texts_stage(ctx, EntityAttributeTextsParams.of(cfg), kg["entities"])["entity_texts"]
    entity_embeddings = embed(ctx, EmbedParams.of(cfg, id_col="entity_id"), texts)["embeddings"]
    hierarchy = hierarchy_stage(ctx, hierarchy_params(cfg), kg["entities"], kg["relations"], entity_embeddings,
                                kg["kg_meta"], cfg.llm)
    chnsw = chnsw_stage(ctx, CHNSWBuildParams.of(cfg), entity_embeddings, hierarchy["community_embeddings"])
    dense = ({"passage_embeddings": embed(ctx, EmbedParams.of(cfg, id_col="doc_id", use_template=True),
                                          documents)["embeddings"]}
             if p.topk_chunk else {})  # the authors' code: a separate dense index of the passages (topk_chunk)
    return {"chunks": chunks, **kg, "entity_embeddings": entity_embeddings, **hierarchy, **chnsw, **dense}


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> ArchRetriever:
    """Online side of ``method=archrag``."""
    return ArchRetriever(data, index, cfg.method, cfg.embedder)
