"""The entity layer shared by the graph methods: vocabulary, incidence matrices, query linking.

Entities are normalised NER strings (``tasks.text.ner.normalize_entity``); a node per distinct string.
Incidence counts come from the index's own mentions (never from substring counting).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from tasks.core.stage import RunContext, StageParams, input_fps, run_stage, stage, wired
from tasks.core.store import ArtifactRef, Store
from tasks.text.ner import normalize_entity


def entity_vocabulary(mentions: pd.DataFrame) -> pd.DataFrame:
    """``entities(entity_idx, entity, n_words)`` sorted by string (stable across corpus order)."""
    names = np.sort(mentions["entity"].unique())
    return pd.DataFrame({"entity_idx": np.arange(len(names), dtype=np.int64), "entity": names,
                         "n_words": [len(n.split()) for n in names]})


def incidence(mentions: pd.DataFrame, id_col: str, row_ids: list[str], vocab: pd.DataFrame) -> pd.DataFrame:
    """COO ``(row, col, value)``: how often entity ``col`` is mentioned in row ``row`` (row = position in ``row_ids``)."""
    row_of = pd.Series(np.arange(len(row_ids), dtype=np.int64), index=pd.Index(row_ids))
    col_of = pd.Series(vocab["entity_idx"].to_numpy(), index=pd.Index(vocab["entity"]))
    m = mentions[mentions[id_col].isin(row_of.index) & mentions["entity"].isin(col_of.index)]
    pairs = pd.DataFrame({"row": row_of.loc[m[id_col]].to_numpy(), "col": col_of.loc[m["entity"]].to_numpy()})
    counts = pairs.groupby(["row", "col"]).size().rename("value").reset_index()
    return counts.astype({"row": "int64", "col": "int64", "value": "float64"})


def chunk_mentions(doc_mentions: pd.DataFrame, chunks: pd.DataFrame) -> pd.DataFrame:
    """Document mentions → chunk mentions, by character offsets (a mention belongs to the chunk holding its start)."""
    c = chunks[["chunk_id", "doc_id", "start", "end"]].astype({"start": "int64", "end": "int64"}).sort_values("start")
    m = doc_mentions.astype({"start": "int64", "end": "int64"}).sort_values("start")
    joined = pd.merge_asof(m, c.rename(columns={"start": "c_start", "end": "c_end"}), left_on="start",
                           right_on="c_start", by="doc_id", direction="backward")
    joined = joined[joined["chunk_id"].notna() & (joined["start"] < joined["c_end"])]
    return joined[["chunk_id", "surface", "label", "start", "end", "entity"]].reset_index(drop=True)


def text_mentions(mentions: pd.DataFrame, id_col: str, text_start: pd.Series) -> pd.DataFrame:
    """Mentions found in a rendered text (``title + "\n" + text``) → offsets into the row's own text.

    ``text_start`` (indexed by ``id_col``): where the text begins in the rendered one. A mention in the title
    (before it) gets ``start = end = 0``, so it belongs to the row's first chunk (:func:`chunk_mentions`)."""
    shift = text_start.reindex(mentions[id_col]).to_numpy(np.int64)
    start = np.maximum(mentions["start"].to_numpy(np.int64) - shift, 0)
    end = np.maximum(mentions["end"].to_numpy(np.int64) - shift, 0)
    return mentions.assign(start=start.astype(mentions["start"].dtype), end=end.astype(mentions["end"].dtype))


@dataclass(frozen=True)
class TextMentionsParams(StageParams):
    """The id column of the rendered passages (no config: the offsets follow from the inputs)."""

    id_col: str = wired()


@stage("text_mentions", params=TextMentionsParams)
def passage_text_mentions(ctx: RunContext, params: TextMentionsParams, mentions: ArtifactRef,
                          rendered: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: the mentions NER found in ``rendered`` (:func:`tasks.text.embed.embedded_texts`), with offsets into
    each passage's own text (:func:`text_mentions`), the shape every entity stage reads."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        starts = Store.read(rendered, [params.id_col, "text_start"]).set_index(params.id_col)["text_start"]
        out = text_mentions(Store.read(mentions), params.id_col, starts)
        return {"mentions": out}, len(out)

    return run_stage(ctx, params, input_fps(mentions=mentions, rendered=rendered), compute)


_WORD = re.compile(r"\w+")


def query_entity_links(questions: list[str], vocab_index: dict[str, int], max_words: int,
                       question_entities: list[list[str]] | None) -> list[list[int]]:
    """Entities a question contains: word n-grams of the normalised question found in the vocabulary,
    plus the question's own NER mentions (normalised strings) found there (ZoomRAG's indicator
    'query contains entity')."""
    found: list[list[int]] = []
    for q, names in zip(questions, question_entities or [[]] * len(questions)):
        words = normalize_entity(q).split()
        hits = {vocab_index[g] for n in range(1, max_words + 1) for i in range(len(words) - n + 1)
                if (g := " ".join(words[i:i + n])) in vocab_index}
        hits.update(vocab_index[e] for e in names if e in vocab_index)
        found.append(sorted(hits))
    return found


@dataclass(frozen=True)
class EntityGraphParams(StageParams):
    """None: the entity layer follows from its inputs (the NER's mentions already carry the NER settings)."""


@stage("entity_graph", params=EntityGraphParams)
def entity_graph(ctx: RunContext, params: EntityGraphParams, documents: ArtifactRef, chunks: ArtifactRef | None,
                 doc_mentions: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: entity vocabulary and doc–entity (and chunk–entity) incidence, as COO tables."""
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        doc_ids = Store.read(documents, ["doc_id"])["doc_id"].tolist()
        mentions = Store.read(doc_mentions)
        vocab = entity_vocabulary(mentions)
        out = {"entities": vocab, "doc_entity": incidence(mentions, "doc_id", doc_ids, vocab)}
        if chunks is not None:
            ch = Store.read(chunks, ["chunk_id", "doc_id", "start", "end"])
            out["chunk_entity"] = incidence(chunk_mentions(mentions, ch), "chunk_id", ch["chunk_id"].tolist(), vocab)
        return out, len(vocab)

    return run_stage(ctx, params, input_fps(documents=documents, chunks=chunks, mentions=doc_mentions), compute)


@dataclass(frozen=True)
class EntityTextsParams(StageParams):
    """None: an entity's text is its name."""


@stage("entity_texts", params=EntityTextsParams)
def entity_texts(ctx: RunContext, params: EntityTextsParams, entities: ArtifactRef) -> dict[str, ArtifactRef]:
    """Stage: ``entity_texts(entity_id, text)`` in vocabulary order, the shared embed stage's input.

    An entity node is its normalised string, so the id is the string and so is the text.
    """
    def compute() -> tuple[dict[str, pd.DataFrame], int]:
        vocab = Store.read(entities, ["entity_idx", "entity"]).sort_values("entity_idx")
        names = vocab["entity"].astype(str).to_numpy()
        return {"entity_texts": pd.DataFrame({"entity_id": names, "text": names})}, len(names)

    return run_stage(ctx, params, input_fps(entities=entities), compute)
