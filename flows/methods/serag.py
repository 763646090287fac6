"""SeRAG DAG (the anonymous ICML submission, undated, Fig. 1): passages → chunks, NER, embeddings → multi-perspective graph (§3.1)
→ 2-D encoding tree minimising structural entropy (eq. 1, K = 2) → community vectors (§3.2, eqs. 8–9).

Online (§3.3): self-query pseudo-document (with an LLM) → coarse top-k_coarse communities → hybrid
chunk scores (eqs. 10–13) → passages.
"""
from __future__ import annotations

from flows.methods import Method, always
from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef
from tasks.methods.serag.retriever import SelfQuery, SeRAGRetriever, self_query_client
from tasks.methods.serag.params import CommunitiesParams, SeRAGGraphParams, SeRAGParams, TreeParams
from tasks.methods.serag.stages import serag_communities, serag_graph, serag_tree, stored_update, update_summary
from tasks.text.chunk import ChunkParams, chunk
from tasks.text.embed import EmbeddedTextsParams, EmbedParams, embed, embedded_texts
from tasks.text.entities import (
    EntityGraphParams,
    EntityTextsParams,
    TextMentionsParams,
    entity_graph,
    entity_texts,
    passage_text_mentions,
)
from tasks.text.linking_stages import LinkedGraphParams, linked_entity_graph
from tasks.llm.ner_backends import QueryRecogniser, ner, ner_params


def _dag(ctx: RunContext, data: dict[str, ArtifactRef], cfg, incremental: bool) -> dict[str, ArtifactRef]:
    """SeRAG's index stages (``incremental``: the graph grows from the latest stored one)."""
    p, documents = cfg.method, data["documents"]
    if p.ner_input == "embedded" and p.chunk_unit == "passage":  # NER reads the text embedded: title + text
        rendered = embedded_texts(ctx, EmbeddedTextsParams.of(cfg, id_col="doc_id"), documents)["embedded_texts"]
        mentions = ner(ctx, ner_params(cfg, "doc_id"), rendered, cfg.llm, submit=True)
        mentions = passage_text_mentions.submit(ctx, TextMentionsParams.of(cfg, id_col="doc_id"),
                                                mentions.result()["mentions"], rendered)
    else:  # chunks are embedded as their text (or ner_input=text): NER reads the passage text
        mentions = ner(ctx, ner_params(cfg, "doc_id"), documents, cfg.llm, submit=True)
    chunks = chunk(ctx, ChunkParams.of(cfg), documents)["chunks"]
    if p.chunk_unit == "passage":  # one chunk per passage, in passage order: embed it as dense does (title + text)
        chunk_embeddings = embed(ctx, EmbedParams.of(cfg, id_col="doc_id", use_template=True), documents)["embeddings"]
    else:
        chunk_embeddings = embed(ctx, EmbedParams.of(cfg, id_col="chunk_id"), chunks)["embeddings"]
    entities = (linked_entity_graph(ctx, LinkedGraphParams.of(cfg), documents, chunks, mentions.result()["mentions"])
                if p.graph_linking == "gazetteer"  # beyond the paper: titles and corpus names as entity nodes
                else entity_graph(ctx, EntityGraphParams.of(cfg), documents, chunks, mentions.result()["mentions"]))
    names = entity_texts(ctx, EntityTextsParams.of(cfg), entities["entities"])["entity_texts"]
    entity_embeddings = embed(ctx, EmbedParams.of(cfg, id_col="entity_id"), names)["embeddings"]
    graph_inputs = (ctx, SeRAGGraphParams.of(cfg), documents, chunks, chunk_embeddings, entities["chunk_entity"],
                    entities["entities"])
    if not incremental and p.reuse_updates:  # a graph flows.commands.update grew for this very corpus: used as it is
        incremental = stored_update(*graph_inputs)
    graph = serag_graph(*graph_inputs, incremental)
    tree = serag_tree(ctx, TreeParams.of(cfg), graph["W"], graph["W_meta"])
    communities = serag_communities(ctx, CommunitiesParams.of(cfg), graph["W"], tree["community"], chunk_embeddings)
    return {"chunks": chunks, "chunk_embeddings": chunk_embeddings, **entities,
            "entity_embeddings": entity_embeddings, **graph, **tree, **communities}


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=serag``: a full build of the graph, unless ``flows.commands.update`` stored one grown for
    exactly this corpus (and ``method.reuse_updates``)."""
    return _dag(ctx, data, cfg, incremental=False)


def update(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """``flows.commands.update``: the same stages; the graph grows from the latest stored one of this dataset
    (only rows involving new chunks are computed), the encoding tree and community vectors are rebuilt."""
    return _dag(ctx, data, cfg, incremental=True)


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> SeRAGRetriever:
    """Online side of ``method=serag``."""
    p = cfg.method
    return SeRAGRetriever(data, index, p, cfg.embedder,
                          QueryRecogniser(cfg.ner, cfg.llm, cfg.artifacts_dir) if p.query_ner else None,
                          SelfQuery(self_query_client(p, cfg.llm, cfg.artifacts_dir), p.self_query_max_tokens))


def llm_uses(conf, command: str) -> list[str]:
    """SeRAG's own LLM call: the self-query pseudo-document of each question (§3.3), whenever questions are asked."""
    if conf.method.self_query and command in ("evaluate", "benchmark", "query", "serve"):
        return ["method.self_query=true"]
    return []


METHOD = Method("serag", SeRAGParams, index, retriever, disk_bytes_per_passage=4_500, runs_ner=always,
                llm_uses=llm_uses, update=update, update_summary=update_summary)
