"""The stages of title-aware linking, beyond the papers: the linked entity graph (titles and the corpus's
names as entity nodes, matched by :mod:`tasks.text.gazetteer`) and the relation sentences the relation gate
reads (:mod:`tasks.graph.relation_gate`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np
import pandas as pd
import scipy.sparse as sp

from tasks.core.stage import RunContext, StageParams, from_config, input_fps, run_stage, stage
from tasks.core.store import ArtifactRef, Store
from tasks.graph.relation_gate import RelationGate
from tasks.text.embed import EmbedParams, embed, load_embeddings
from tasks.text.gazetteer import (Gazetteer, aliases_of, build_names, linked_incidence, mask_names,
                                   unambiguous_short_forms)

@dataclass(frozen=True)
class LinkedGraphParams(StageParams):
    """The gazetteer's entity layer (``method.graph_linking=gazetteer``): shortest name, and title aliases."""

    SOURCES = ("method",)
    min_chars: int = from_config("gazetteer_min_chars")
    title_aliases: bool = False
    alias_min_share: float = 0.5


@stage("linked_entity_graph", params=LinkedGraphParams)
def linked_entity_graph(ctx: RunContext, params: LinkedGraphParams, documents: ArtifactRef, chunks: ArtifactRef,
                        doc_mentions: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: the gazetteer's entity vocabulary and doc–/chunk–entity counts, the tables
    :func:`tasks.text.entities.entity_graph` writes (``graph_linking: gazetteer``). With ``title_aliases``
    the vocabulary's ``aliases`` column holds each title's unambiguous short forms
    (:func:`unambiguous_short_forms`), and the chunks are matched with them."""
    min_chars = params.min_chars

    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        docs = Store.read(documents, ["doc_id", "title"])
        ch = Store.read(chunks, ["chunk_id", "doc_id", "position", "text"])
        surfaces = Store.read(doc_mentions, ["surface"])["surface"].astype(str).tolist()
        titles, texts = docs["title"].astype(str).tolist(), ch["text"].astype(str).tolist()
        vocab = build_names(titles, surfaces, min_chars)
        names = vocab["entity"].tolist()
        doc_pos = pd.Series(np.arange(len(docs), dtype=np.int64), index=pd.Index(docs["doc_id"]))
        chunk_doc = doc_pos.loc[ch["doc_id"]].to_numpy()
        first = np.full(len(docs), -1, dtype=np.int64)
        lowest = pd.Series(ch["position"].to_numpy()).groupby(chunk_doc).idxmin()
        first[lowest.index.to_numpy()] = lowest.to_numpy()
        doc_entity, chunk_entity = linked_incidence(titles, texts, chunk_doc, first, Gazetteer.of(names))
        if params.title_aliases:  # a second pass: the first one's passage–name counts decide which short forms stand
            doc_names = sp.csr_array((doc_entity["value"], (doc_entity["row"], doc_entity["col"])),
                                     shape=(len(docs), len(names)))
            doc_texts = pd.Series(texts).groupby(chunk_doc).agg(" ".join).reindex(range(len(docs)), fill_value="")
            aliases = unambiguous_short_forms(titles, doc_texts.tolist(), names, doc_names, params.alias_min_share,
                                              min_chars)
            joined = pd.Series(list(aliases), dtype=object).groupby(list(aliases.values())).agg("|".join)
            vocab["aliases"] = joined.reindex(vocab["entity_idx"]).fillna("").to_numpy(dtype=object)
            doc_entity, chunk_entity = linked_incidence(titles, texts, chunk_doc, first,
                                                        Gazetteer.of(names, aliases=aliases))
        return {"entities": vocab, "doc_entity": doc_entity, "chunk_entity": chunk_entity}, len(vocab)

    return run_stage(ctx, params, input_fps(documents=documents, chunks=chunks, mentions=doc_mentions), compute)


@dataclass(frozen=True)
class RelationSentencesParams(StageParams):
    """The shortest name masked (``method.gazetteer_min_chars``)."""

    SOURCES = ("method",)
    min_chars: int = from_config("gazetteer_min_chars")


@stage("relation_sentences", params=RelationSentencesParams)
def relation_sentences(ctx: RunContext, params: RelationSentencesParams, chunks: ArtifactRef, entities: ArtifactRef,
                       chunk_entity: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage (beyond the paper, ``relation_gate_masked``): ``relation_sentences(chunk_id, text)``, every chunk
    that writes a title's name, with the names it writes capitalised left out (:func:`mask_names`). The masked
    relation gate (ZoomRAG, LinearRAG) compares these with the questions, likewise masked, so that the relation
    decides and not a name the two share."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        vocab = Store.read(entities).sort_values("entity_idx")
        ce = Store.read(chunk_entity, ["row", "col"])
        is_title = vocab["is_title"].to_numpy(dtype=bool)
        rows = np.unique(ce["row"].to_numpy()[is_title[ce["col"].to_numpy()]])
        ch = Store.read(chunks, ["chunk_id", "text"])
        gaz = Gazetteer.of(vocab["entity"].tolist(), params.min_chars, aliases_of(vocab))
        masked = mask_names(ch["text"].astype(str).to_numpy()[rows].tolist(), gaz)
        return {"relation_sentences": pd.DataFrame({"chunk_id": ch["chunk_id"].to_numpy()[rows], "text": masked})}, len(rows)

    return run_stage(ctx, params, input_fps(chunks=chunks, entities=entities, chunk_entity=chunk_entity), compute)


def masked_relation_gate(gate: RelationGate, index: Mapping[str, ArtifactRef], chunk_ids: np.ndarray) -> RelationGate:
    """``gate`` comparing questions with its sentences' masked embeddings (:func:`relation_sentences`, then the
    embed stage) instead of their own; ``chunk_ids`` are the ids of the chunks table that ``gate.chunks`` indexes."""
    if "relation_embeddings" not in index:
        raise RuntimeError("method.relation_gate_masked=true needs the relation_sentences stage: index again")
    ids, emb = load_embeddings(index["relation_embeddings"], "chunk_id")
    row = pd.Series(np.arange(len(ids)), index=pd.Index(ids))
    wanted = pd.Index(np.asarray(chunk_ids, dtype=object)[gate.chunks])
    if not wanted.isin(row.index).all():
        raise RuntimeError("relation_sentences lacks chunks the gate reads; delete the artifacts and index again")
    return replace(gate, chunk_emb=np.ascontiguousarray(emb[row.loc[wanted].to_numpy()], dtype=np.float32))


def index_relation_embeddings(ctx: RunContext, params: RelationSentencesParams, embed_params: EmbedParams,
                              chunks: ArtifactRef, entities: ArtifactRef, chunk_entity: ArtifactRef
                              ) -> dict[str, ArtifactRef]:
    """The index's ``relation_embeddings`` for the masked relation gate: :func:`relation_sentences`, embedded
    (``embed_params``: over ``chunk_id`` rows)."""
    masked = relation_sentences(ctx, params, chunks, entities, chunk_entity)
    embedded = embed(ctx, embed_params, masked["relation_sentences"])
    return {"relation_embeddings": embedded["embeddings"]}
