"""LinearRAG DAG (paper section 3.1): passages -> sentences, NER, embeddings -> Tri-Graph (C, M) -> entity embeddings.

Online (section 3.2): query NER + encoding -> entity activation by semantic bridging -> PPR over the
passage-entity graph seeded by eq. (7). No edges link passages by their corpus position.
"""
from __future__ import annotations

from flows.methods import Method, always
from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef
from tasks.methods.linearrag.params import LinearParams
from tasks.methods.linearrag.retriever import LinearRetriever
from tasks.methods.linearrag.stages import (  # the shared stages the Tri-Graph is built by
    ChunkParams,
    EmbedParams,
    EntityGraphParams,
    EntityTextsParams,
    LinkedGraphParams,
    RelationSentencesParams,
    chunk,
    embed,
    entity_graph,
    entity_texts,
    index_relation_embeddings,
    linked_entity_graph,
    ner,
    ner_params,
)
from tasks.llm.ner_backends import QueryRecogniser


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=linearrag``."""
    p, documents = cfg.method, data["documents"]
    mentions = ner(ctx, ner_params(cfg, "doc_id"), documents, cfg.llm, submit=True)
    sentences = chunk(ctx, ChunkParams.of(cfg), documents)["chunks"]  # sentences (section 3.1)
    passage_embeddings = embed(ctx, EmbedParams.of(cfg, id_col="doc_id", use_template=True), documents)["embeddings"]
    sentence_embeddings = embed(ctx, EmbedParams.of(cfg, id_col="chunk_id"), sentences)["embeddings"]
    graph = (linked_entity_graph(ctx, LinkedGraphParams.of(cfg), documents, sentences, mentions.result()["mentions"])
             if p.graph_linking == "gazetteer"  # beyond the paper: titles and corpus names as entity nodes
             else entity_graph(ctx, EntityGraphParams.of(cfg), documents, sentences, mentions.result()["mentions"]))
    out = {"sentences": sentences, "passage_embeddings": passage_embeddings,
           "sentence_embeddings": sentence_embeddings, "entities": graph["entities"],
           "contain": graph["doc_entity"], "mention": graph["chunk_entity"]}
    if p.query_ner:  # eq. (3) matches the question's NER strings to entity embeddings; the gazetteer alone needs none
        entities = entity_texts(ctx, EntityTextsParams.of(cfg), graph["entities"])["entity_texts"]
        out["entity_embeddings"] = embed(ctx, EmbedParams.of(cfg, id_col="entity_id"), entities)["embeddings"]
    if p.relation_gate_temperature > 0 and p.relation_gate_masked:  # beyond the paper: the gate reads relations
        out |= index_relation_embeddings(ctx, RelationSentencesParams.of(cfg), EmbedParams.of(cfg, id_col="chunk_id"),
                                         sentences, graph["entities"], graph["chunk_entity"])
    return out


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> LinearRetriever:
    """Online side of ``method=linearrag``."""
    return LinearRetriever(data, index, cfg.method, cfg.embedder,
                          QueryRecogniser(cfg.ner, cfg.llm, cfg.artifacts_dir) if cfg.method.query_ner else None,
                          cfg.ner.model)


METHOD = Method("linearrag", LinearParams, index, retriever, disk_bytes_per_passage=10_500, runs_ner=always)
