"""ZoomRAG DAG (paper Fig. 2): documents → chunks, NER, embeddings → entity graph → doc–doc block → M.

Online: DocZoom over M from each query node, then ChunkZoom over the chunks of the top-K documents.
"""
from __future__ import annotations

from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef
from tasks.methods.zoomrag.retriever import ZoomRetriever
from tasks.methods.zoomrag.stages import (
    DocDocParams,
    GlobalBlockParams,
    ZoomRAGParams,
    doc_doc_graph,
    global_block,
)
from tasks.text.chunk import chunk
from tasks.text.embed import embed
from tasks.text.gazetteer import index_relation_embeddings, linked_entity_graph
from tasks.text.entities import entity_graph
from tasks.text.ner import QueryRecogniser, ner

__all__ = ["ZoomRAGParams", "index", "retriever"]


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=zoomrag``."""
    p, documents = cfg.method, data["documents"]
    mentions = ner.submit(ctx, documents, "doc_id", cfg.ner, cfg.llm)
    chunks = chunk(ctx, documents, p.chunking())["chunks"]
    doc_embeddings = embed(ctx, documents, "doc_id", cfg.embedder, use_template=True)["embeddings"]
    chunk_embeddings = embed(ctx, chunks, "chunk_id", cfg.embedder)["embeddings"]
    graph = (linked_entity_graph(ctx, documents, chunks, mentions.result()["mentions"], p.gazetteer_min_chars,
                                 p.title_aliases, p.alias_min_share)
             if p.graph_linking == "gazetteer"  # beyond the paper: titles and corpus names as entity nodes
             else entity_graph(ctx, documents, chunks, mentions.result()["mentions"]))
    doc_doc = doc_doc_graph(ctx, DocDocParams.of(cfg), doc_embeddings)["doc_doc"]
    block = global_block(ctx, GlobalBlockParams.of(cfg), doc_doc, graph["doc_entity"], graph["entities"],
                         documents.rows)
    out = {"chunks": chunks, "doc_embeddings": doc_embeddings, "chunk_embeddings": chunk_embeddings, **graph, **block}
    if p.relation_gate_temperature > 0 and p.relation_gate_masked:  # beyond the paper: the gate reads relations
        out |= index_relation_embeddings(ctx, chunks, graph["entities"], graph["chunk_entity"], p.gazetteer_min_chars,
                                         cfg.embedder)
    return out


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> ZoomRetriever:
    """Online side of ``method=zoomrag``."""
    return ZoomRetriever(data, index, cfg.method, cfg.embedder,
                          QueryRecogniser(cfg.ner, cfg.llm, cfg.artifacts_dir) if cfg.method.query_ner else None)
