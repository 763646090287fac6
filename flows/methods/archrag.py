"""ArchRAG DAG (Wang et al., 2025, Fig. 2): passages → chunks → knowledge graph (``kg=llm``, the paper's; or the
LLM-free ``kg=cooccur``) → entity attributes → attributed communities layer by layer with a summary each
(Algorithm 1) → C-HNSW over entities and every community layer (§3.1.3).

Online (§3.2): encode → hierarchical search, k per layer → passages by the harness's rule (recall@k); with
an LLM, adaptive filtering-based generation over the retrieved items (eqs. 3–4).
"""
from __future__ import annotations

from flows.methods import Method
from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef
from tasks.methods.archrag.stages import archrag_kg
from tasks.methods.archrag.params import kg_params
from tasks.methods.archrag.retriever import ArchRetriever
from tasks.methods.archrag.retriever import answer as generate
from tasks.methods.archrag.params import ArchParams, CHNSWBuildParams, EntityAttributeTextsParams, hierarchy_params
from tasks.methods.archrag.stages import chnsw_stage, entity_texts_stage, hierarchy_stage, update_summary
from tasks.text.chunk import ChunkParams, chunk
from tasks.text.embed import EmbedParams, embed
from tasks.llm.ner_backends import ner, ner_params


def index(ctx: RunContext, data: dict[str, ArtifactRef], cfg) -> dict[str, ArtifactRef]:
    """Index stages of ``method=archrag``; ``flows.commands.update`` runs the same ones (per-chunk stages are
    row-incremental, communities are recomputed, unchanged communities keep their cached summaries)."""
    p, documents = cfg.method, data["documents"]
    chunks = chunk(ctx, ChunkParams.of(cfg), documents)["chunks"]
    mentions = (ner(ctx, ner_params(cfg, "doc_id"), documents, cfg.llm)["mentions"] if cfg.kg.builder == "cooccur"
                else None)
    kg = archrag_kg(ctx, kg_params(cfg), documents, chunks, mentions, cfg.llm)
    texts = entity_texts_stage(ctx, EntityAttributeTextsParams.of(cfg), kg["entities"])["entity_texts"]
    entity_embeddings = embed(ctx, EmbedParams.of(cfg, id_col="entity_id"), texts)["embeddings"]
    hierarchy = hierarchy_stage(ctx, hierarchy_params(cfg), kg["entities"], kg["relations"], entity_embeddings,
                                kg["kg_meta"], cfg.llm)
    chnsw = chnsw_stage(ctx, CHNSWBuildParams.of(cfg), entity_embeddings, hierarchy["community_embeddings"])
    dense = ({"passage_embeddings": embed(ctx, EmbedParams.of(cfg, id_col="doc_id", use_template=True),
                                          documents)["embeddings"]}
             if p.topk_chunk or p.passage_rule in ("auto", "source_relevance")
             else {})  # the authors' code: a separate dense index of the passages (topk_chunk); source_relevance ranks by it
    return {"chunks": chunks, **kg, "entity_embeddings": entity_embeddings, **hierarchy, **chnsw, **dense}


def retriever(data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg) -> ArchRetriever:
    """Online side of ``method=archrag``."""
    return ArchRetriever(data, index, cfg.method, cfg.embedder)


def answer(client, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef], cfg, questions, traces,
           dry_run: bool):
    """ArchRAG's own generation (§3.2.2, adaptive filtering) over what each question retrieved."""
    return generate(client, data, index, cfg.method, cfg.embedder, questions, traces, dry_run)


def runs_ner(conf) -> bool:
    """The LLM-free knowledge graph (``kg=cooccur``) links the entities NER finds; the paper's (``kg=llm``) does not."""
    return conf.kg.builder == "cooccur"


def llm_uses(conf, command: str) -> list[str]:
    """ArchRAG's own LLM calls: extracting the knowledge graph with ``kg=llm`` (§3.1.1)."""
    return ["kg=llm"] if conf.kg.builder == "llm" and not conf.eval.llm_dry_run else []


def check(conf) -> None:
    """``kg=llm`` cannot run without a chat model (a ValueError, which the config check reports as its own)."""
    if conf.kg.builder == "llm" and conf.llm.provider == "none":
        raise ValueError("kg=llm extracts ArchRAG's knowledge graph with the chat model: add llm=local "
                          "llm.base_url=... or llm=openai, or use kg=cooccur (LLM-free, not the paper's)")


# its update is its index DAG run again: per-chunk stages are row-incremental, Leiden regroups the communities
METHOD = Method("archrag", ArchParams, index, retriever, disk_bytes_per_passage=5_400, runs_ner=runs_ner,
                llm_uses=llm_uses, check=check, answer=answer, update_summary=update_summary)
