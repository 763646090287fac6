"""ZoomRAG DAG (paper Fig. 2): documents → chunks, NER, embeddings → entity graph → doc–doc block → M.

Online: DocZoom over M from each query node, then ChunkZoom over the chunks of the top-K documents.
"""
from __future__ import annotations

from flows.methods import Method, always
from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef
from tasks.methods.zoomrag.retriever import ZoomRetriever
from tasks.methods.zoomrag.params import DocDocParams, GlobalBlockParams, ZoomRAGParams
from tasks.methods.zoomrag.stages import doc_doc_graph, global_block
from tasks.text.chunk import ChunkParams, chunk
from tasks.text.embed import EmbedParams, embed
from tasks.text.linking_stages import (
    LinkedGraphParams,
    RelationSentencesParams,
    index_relation_embeddings,
    linked_entity_graph,
)
from tasks.text.entities import EntityGraphParams, entity_graph
from tasks.llm.ner_backends import QueryRecogniser, ner, ner_params


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=zoomrag``."""
    p, documents = cfg.method, data["documents"]
    mentions = ner(ctx, ner_params(cfg, "doc_id"), documents, cfg.llm, submit=True)
    chunks = chunk(ctx, chunking(cfg), documents)["chunks"]
    doc_embeddings = embed(ctx, EmbedParams.of(cfg, id_col="doc_id", use_template=True), documents)["embeddings"]
    chunk_embeddings = embed(ctx, EmbedParams.of(cfg, id_col="chunk_id"), chunks)["embeddings"]
    graph = (linked_entity_graph(ctx, LinkedGraphParams.of(cfg), documents, chunks, mentions.result()["mentions"])
             if p.graph_linking == "gazetteer"  # beyond the paper: titles and corpus names as entity nodes
             else entity_graph(ctx, EntityGraphParams.of(cfg), documents, chunks, mentions.result()["mentions"]))
    doc_doc = doc_doc_graph(ctx, DocDocParams.of(cfg), doc_embeddings)["doc_doc"]
    block = global_block(ctx, GlobalBlockParams.of(cfg), doc_doc, graph["doc_entity"], graph["entities"],
                         documents.rows)
    out = {"chunks": chunks, "doc_embeddings": doc_embeddings, "chunk_embeddings": chunk_embeddings, **graph, **block}
    if p.relation_gate_temperature > 0 and p.relation_gate_masked:  # beyond the paper: the gate reads relations
        out |= index_relation_embeddings(ctx, RelationSentencesParams.of(cfg), EmbedParams.of(cfg, id_col="chunk_id"),
                                         chunks, graph["entities"], graph["chunk_entity"])
    return out


def chunking(cfg) -> ChunkParams:
    """How ChunkZoom's chunks are cut. §3.2 and Table 11: sentences of short documents (the default, over the
    passages every method indexes); ``chunk_unit: window`` (with ``dataset.split.enabled=false``) maps the two
    levels to a long document and its token windows instead. The window sizes are read only for windows, so the
    sentence chunks stay the stage LinearRAG shares."""
    if cfg.method.chunk_unit == "window":
        return ChunkParams.of(cfg)
    return ChunkParams.of(cfg, window_tokens=ChunkParams.window_tokens, overlap_tokens=ChunkParams.overlap_tokens)


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> ZoomRetriever:
    """Online side of ``method=zoomrag``."""
    return ZoomRetriever(data, index, cfg.method, cfg.embedder,
                          QueryRecogniser(cfg.ner, cfg.llm, cfg.artifacts_dir) if cfg.method.query_ner else None)


METHOD = Method("zoomrag", ZoomRAGParams, index, retriever, disk_bytes_per_passage=10_000, runs_ner=always,
                evidence_units=True)
