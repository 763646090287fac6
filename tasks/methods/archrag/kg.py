"""ArchRAG's knowledge graph G(V, E) (paper §3.1.1): entities and relations with textual attributes.

Two builders with one output shape (``entities``, ``relations``; see :data:`ENTITY_COLUMNS`,
:data:`RELATION_COLUMNS`):

* ``llm`` — the paper's: one LLM extraction per chunk (entities with type and description,
  relationships with a description), subgraphs merged on the normalised name, repeated
  descriptions consolidated by the LLM (§3.1.1; the authors ran GraphRAG for it, notes §1).
* ``cooccur`` — NOT the paper's: an LLM-free stand-in. Entities are the spaCy NER mentions,
  relations link two entities named in one sentence, descriptions are the entities' own sentences.

Ids are positions in the name-sorted entity list, so they do not depend on corpus order. A relation
is one row per unordered pair (``head < tail``), no self loops. Pure functions: the LLM is reached
only through an ``LLMClient`` passed in (cache and ledger are the client's).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from tasks.llm.params import Messages
from tasks.text.ner import normalize_entity
from tasks.text.sentences import sentence_spans

if TYPE_CHECKING:
    from tasks.llm.client import LLMClient

BUILDERS = ("cooccur", "llm")
ENTITY_TYPES = ("person", "organisation", "location", "event", "other")  # GraphRAG's defaults (notes §1) + other
UNKNOWN_TYPE = "unknown"  # an entity named only as a relationship endpoint
EXTRACT_STAGE = "archrag_extract"   # ledger stage of the per-chunk extraction
DESCRIBE_STAGE = "archrag_describe"  # ledger stage of the description summaries

ENTITY_SCHEMA = pa.schema([("entity_id", pa.int64()), ("name", pa.string()), ("type", pa.string()),
                           ("description", pa.string()), ("chunk_ids", pa.list_(pa.string())),
                           ("n_chunks", pa.int64())])
RELATION_SCHEMA = pa.schema([("head", pa.int64()), ("tail", pa.int64()), ("description", pa.string()),
                             ("weight", pa.float64())])
ENTITY_COLUMNS = tuple(ENTITY_SCHEMA.names)
RELATION_COLUMNS = tuple(RELATION_SCHEMA.names)


# ----------------------------------------------------------------------------- shared helpers

def output_frames(entities: pd.DataFrame, relations: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both tables in the one output shape: the columns of :data:`ENTITY_COLUMNS` / :data:`RELATION_COLUMNS`
    with fixed dtypes (``chunk_ids`` a column of lists), even when empty."""
    ent = entities[list(ENTITY_COLUMNS)].astype({"entity_id": "int64", "name": str, "type": str,
                                                 "description": str, "n_chunks": "int64"})
    ent["chunk_ids"] = pd.Series([list(c) for c in ent["chunk_ids"].tolist()], dtype=object, index=ent.index)
    rel = relations[list(RELATION_COLUMNS)].astype({"head": "int64", "tail": "int64", "description": str,
                                                    "weight": "float64"})
    return ent.reset_index(drop=True), rel.reset_index(drop=True)


def to_arrow(entities: pd.DataFrame, relations: pd.DataFrame) -> tuple[pa.Table, pa.Table]:
    """The tables as stored: :data:`ENTITY_SCHEMA` and :data:`RELATION_SCHEMA` (one shape for both builders)."""
    ent, rel = output_frames(entities, relations)
    return (pa.Table.from_pandas(ent, schema=ENTITY_SCHEMA, preserve_index=False),
            pa.Table.from_pandas(rel, schema=RELATION_SCHEMA, preserve_index=False))


def cap_tokens(texts: pd.Series, n: int) -> pd.Series:
    """The first ``n`` whitespace tokens of each text, joined by single spaces."""
    return texts.str.split().str[:n].str.join(" ").fillna("")


def entity_frame(names: np.ndarray, types: pd.Series, descriptions: pd.Series, chunk_lists: pd.Series) -> pd.DataFrame:
    """The ``entities`` table: one row per name of the sorted ``names``, looked up in the name-indexed series."""
    chunk_ids = chunk_lists.reindex(names)
    chunk_ids = [list(c) if isinstance(c, (list, np.ndarray)) else [] for c in chunk_ids.tolist()]
    frame = pd.DataFrame({
        "entity_id": np.arange(len(names), dtype=np.int64),
        "name": pd.Series(names, dtype=object).astype(str),
        "type": types.reindex(names).fillna(UNKNOWN_TYPE).astype(str).to_numpy(),
        "description": descriptions.reindex(names).fillna("").astype(str).to_numpy(),
        "chunk_ids": pd.Series(chunk_ids, dtype=object),
    })
    frame["n_chunks"] = np.fromiter(map(len, chunk_ids), dtype=np.int64, count=len(chunk_ids))
    return frame


def relation_frame(head: np.ndarray, tail: np.ndarray, descriptions: Sequence[str], weight: np.ndarray) -> pd.DataFrame:
    """The ``relations`` table sorted by ``(head, tail)`` (rows are already one per unordered pair)."""
    frame = pd.DataFrame({"head": np.asarray(head, dtype=np.int64), "tail": np.asarray(tail, dtype=np.int64),
                          "description": pd.Series(list(descriptions), dtype=object).astype(str),
                          "weight": np.asarray(weight, dtype=np.float64)})
    return frame.sort_values(["head", "tail"], kind="stable").reset_index(drop=True)


def chunk_lists(pairs: pd.DataFrame, by: str | list[str]) -> pd.Series:
    """Sorted distinct ``chunk_id`` list per ``by`` group."""
    cols = [by] if isinstance(by, str) else list(by)
    distinct = pairs[cols + ["chunk_id"]].drop_duplicates().sort_values(cols + ["chunk_id"])
    return distinct.groupby(by, sort=True)["chunk_id"].agg(list)


# ----------------------------------------------------------------------------- cooccur (LLM-free, not the paper's)

def sentence_table(chunks: pd.DataFrame) -> pd.DataFrame:
    """``sentences(sentence_idx, chunk_id, start, end, text)`` of every chunk, in chunk-table order.

    ``start``/``end`` are document character offsets (chunk ``start`` + the sentence's span in the
    chunk, :func:`tasks.text.sentences.sentence_spans`), the frame document mentions use.
    """
    rows = [(i, a, b, text[a:b]) for i, text in enumerate(chunks["text"].tolist()) for a, b in sentence_spans(text)]
    ci = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    offset = chunks["start"].to_numpy(np.int64)[ci]
    return pd.DataFrame({
        "sentence_idx": np.arange(len(rows), dtype=np.int64),
        "chunk_id": chunks["chunk_id"].to_numpy(dtype=object)[ci],
        "start": offset + np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows)),
        "end": offset + np.fromiter((r[2] for r in rows), dtype=np.int64, count=len(rows)),
        "text": pd.Series([r[3] for r in rows], dtype=object),
    })


def sentence_mentions(mentions: pd.DataFrame, sentences: pd.DataFrame) -> pd.DataFrame:
    """Chunk mentions (``tasks.text.entities.chunk_mentions``) → ``(sentence_idx, chunk_id, entity, label)``:
    a mention belongs to the sentence of its chunk holding its start character."""
    if mentions.empty or sentences.empty:
        return pd.DataFrame({"sentence_idx": np.zeros(0, np.int64), "chunk_id": [], "entity": [], "label": []})
    s = sentences[["sentence_idx", "chunk_id", "start", "end"]].rename(columns={"start": "s_start", "end": "s_end"})
    m = mentions[["chunk_id", "entity", "label", "start"]].astype({"start": "int64"})
    joined = pd.merge_asof(m.sort_values("start"), s.sort_values("s_start"), left_on="start", right_on="s_start",
                           by="chunk_id", direction="backward")
    joined = joined[joined["sentence_idx"].notna() & (joined["start"] < joined["s_end"])]
    out = joined[["sentence_idx", "chunk_id", "entity", "label"]].astype({"sentence_idx": "int64"})
    return out.sort_values(["sentence_idx", "entity"], kind="stable").reset_index(drop=True)


def majority_label(pairs: pd.DataFrame, key: str, label: str) -> pd.Series:
    """Most frequent ``label`` per ``key`` (ties: the alphabetically first), indexed by ``key``."""
    counts = pairs.groupby([key, label]).size().rename("n").reset_index()
    counts = counts.sort_values([key, "n", label], ascending=[True, False, True], kind="stable")
    return counts.drop_duplicates(key).set_index(key)[label]


def sentence_descriptions(sm: pd.DataFrame, sentences: pd.DataFrame, description_tokens: int) -> pd.Series:
    """Per entity: its distinct sentences in corpus-chunk order, joined and capped at ``description_tokens``
    whitespace tokens (sentences wholly past the cap are dropped before joining)."""
    own = sm[["entity", "sentence_idx"]].drop_duplicates()
    own = own.merge(sentences[["sentence_idx", "text"]], on="sentence_idx").sort_values(["entity", "sentence_idx"])
    own = own.drop_duplicates(["entity", "text"])  # distinct sentence texts, first occurrence kept
    n_tok = own["text"].str.count(r"\S+").to_numpy()
    before = own.assign(n=n_tok).groupby("entity")["n"].cumsum().to_numpy() - n_tok
    own = own[before < description_tokens]
    joined = own.groupby("entity", sort=True)["text"].agg(" ".join)
    return cap_tokens(joined, description_tokens)


def cooccur_kg(chunks: pd.DataFrame, mentions: pd.DataFrame, description_tokens: int = 100
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """LLM-free KG (NOT the paper's §3.1.1 builder): ``(entities, relations)`` from spaCy mentions.

    ``chunks``: ``(chunk_id, text, start, end)`` in corpus order; ``mentions``: chunk mentions
    ``(chunk_id, entity, label, start)`` with document offsets and normalised ``entity`` strings.
    Entities are the distinct names, typed by their most frequent NER label; two entities are
    related when they co-occur in one sentence, ``weight`` = number of such sentences, and the
    relation's ``description`` is the first (corpus-chunk order) sentence they share, capped like
    entity descriptions (an entity's own distinct sentences, ``description_tokens`` tokens).
    """
    sentences = sentence_table(chunks)
    sm = sentence_mentions(mentions, sentences)
    names = np.sort(sm["entity"].unique()).astype(object)
    ids = pd.Series(np.arange(len(names), dtype=np.int64), index=pd.Index(names))
    entities = entity_frame(names, majority_label(sm, "entity", "label"),
                            sentence_descriptions(sm, sentences, description_tokens), chunk_lists(sm, "entity"))
    es = pd.DataFrame({"sentence_idx": sm["sentence_idx"].to_numpy(),
                       "eid": ids.reindex(sm["entity"]).to_numpy()}).drop_duplicates()
    pairs = es.merge(es, on="sentence_idx", suffixes=("_h", "_t"))
    pairs = pairs[pairs["eid_h"] < pairs["eid_t"]]
    grouped = pairs.groupby(["eid_h", "eid_t"], sort=True)["sentence_idx"]
    agg = pd.DataFrame({"weight": grouped.size(), "first": grouped.min()}).reset_index()
    text = sentences["text"].to_numpy(dtype=object)[agg["first"].to_numpy(np.int64)]
    desc = cap_tokens(pd.Series(text, dtype=object), description_tokens).tolist()
    relations = relation_frame(agg["eid_h"].to_numpy(), agg["eid_t"].to_numpy(), desc, agg["weight"].to_numpy())
    return output_frames(entities, relations)


# ----------------------------------------------------------------------------- llm (the paper's)

EXTRACT_SCHEMA: dict[str, Any] = {  # type/description may be missing (kept as ""): a record is not lost for them
    "type": "object", "required": ["entities", "relationships"],
    "properties": {
        "entities": {"type": "array", "items": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string"}, "type": {"type": "string"},
                           "description": {"type": "string"}}}},
        "relationships": {"type": "array", "items": {
            "type": "object", "required": ["source", "target"],
            "properties": {"source": {"type": "string"}, "target": {"type": "string"},
                           "description": {"type": "string"}}}},  # "strength" asked, never read (notes §1)
    }}


def extract_messages(text: str) -> Messages:
    """Chat messages asking for the entities and relationships of one chunk as JSON."""
    types = ", ".join(ENTITY_TYPES)
    system = (
        "You turn a passage into knowledge-graph records. First find the entities the passage names "
        f"and give each a name (spelled as in the passage), a type (one of: {types}) and a short "
        "description of what the passage says about it. Then find every pair of those entities that the "
        "passage clearly relates, and give the source and target names (as in your entity list), one "
        "sentence on how they are related, and a strength from 1 (loose) to 10 (tight). Use only the "
        "passage. Reply with JSON only, shaped as "
        '{"entities": [{"name": "...", "type": "...", "description": "..."}], '
        '"relationships": [{"source": "...", "target": "...", "description": "...", "strength": 5}]}; '
        "use empty lists when the passage names nothing.")
    return [{"role": "system", "content": system}, {"role": "user", "content": f"Passage:\n{text}"}]


def llm_extract(client: "LLMClient", texts: list[str], max_tokens: int) -> list[dict | None]:
    """One schema-checked extraction per text (cached, ledger stage ``archrag_extract``; None where invalid)."""
    return client.chat_json([extract_messages(t) for t in texts], EXTRACT_SCHEMA, stage=EXTRACT_STAGE,
                            max_tokens=max_tokens)


EXTRACTION_SCHEMA = pa.schema([("key", pa.string()), ("invalid", pa.bool_())] + [
    (c, pa.list_(pa.string())) for c in ["ent_name", "ent_type", "ent_desc", "rel_source", "rel_target", "rel_desc"]])


def extraction_rows(keys: list[str], replies: Sequence[dict | None]) -> pa.Table:
    """The raw records of each reply, one row per key (:data:`EXTRACTION_SCHEMA`): names as the model wrote
    them (normalised at merge time, so normalisation can change without asking again); ``invalid``
    marks a reply that failed the schema after its repair round."""
    cols: dict[str, list] = {c: [] for c in EXTRACTION_SCHEMA.names}
    for key, reply in zip(keys, replies):
        ents = (reply or {}).get("entities") or []
        rels = (reply or {}).get("relationships") or []
        cols["key"].append(key)
        cols["invalid"].append(reply is None)
        cols["ent_name"].append([str(e["name"]) for e in ents])
        cols["ent_type"].append([str(e.get("type", "")) for e in ents])
        cols["ent_desc"].append([str(e.get("description", "")) for e in ents])
        cols["rel_source"].append([str(r["source"]) for r in rels])
        cols["rel_target"].append([str(r["target"]) for r in rels])
        cols["rel_desc"].append([str(r.get("description", "")) for r in rels])
    return pa.Table.from_pydict(cols, schema=EXTRACTION_SCHEMA)


def extraction_mentions(extractions: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-chunk records (``chunk_id`` + the list columns of :data:`EXTRACTION_SCHEMA`) →
    ``(entity mentions (chunk_id, name, type, description),
    relation mentions (chunk_id, source, target, description))``."""
    ent_cols, rel_cols = ["ent_name", "ent_type", "ent_desc"], ["rel_source", "rel_target", "rel_desc"]
    em = extractions[["chunk_id", *ent_cols]].explode(ent_cols).dropna(subset=["ent_name"])
    rm = extractions[["chunk_id", *rel_cols]].explode(rel_cols).dropna(subset=["rel_source"])
    em = em.rename(columns=dict(zip(ent_cols, ["name", "type", "description"]))).reset_index(drop=True)
    rm = rm.rename(columns=dict(zip(rel_cols, ["source", "target", "description"]))).reset_index(drop=True)
    return em.astype(str), rm.astype(str)


_TYPE_ALIASES = {"organization": "organisation", "org": "organisation", "company": "organisation",
                 "geo": "location", "place": "location", "gpe": "location", "people": "person"}


def canonical_types(types: pd.Series) -> pd.Series:
    """Model-written types → one of :data:`ENTITY_TYPES` (lower-cased, common aliases, anything else ``other``)."""
    t = types.astype(str).str.strip().str.lower().replace(_TYPE_ALIASES)
    return t.where(t.isin(ENTITY_TYPES), "other")


def distinct_descriptions(frame: pd.DataFrame, by: str | list[str]) -> pd.Series:
    """Sorted distinct non-empty (stripped) descriptions per ``by`` group (sorted, so a prompt quoting them
    does not depend on corpus order)."""
    cols = [by] if isinstance(by, str) else list(by)
    d = frame[cols].assign(description=frame["description"].astype(str).str.strip())
    d = d[d["description"] != ""].drop_duplicates().sort_values(cols + ["description"])
    return d.groupby(by, sort=True)["description"].agg(list)


@dataclass(frozen=True)
class MergedKG:
    """The merged subgraphs before descriptions are consolidated: ``entities`` and ``relations`` carry a
    ``descriptions`` list column (sorted distinct descriptions) in place of ``description``."""

    entities: pd.DataFrame
    relations: pd.DataFrame


def merge_extractions(entity_mentions: pd.DataFrame, relation_mentions: pd.DataFrame) -> MergedKG:
    """Merge per-chunk subgraphs on the normalised name (§3.1.1; code: exact match after cleaning, notes §1).

    Entity names and relation endpoints are normalised with ``normalize_entity``; names that
    normalise to nothing and self loops are dropped. An endpoint that no chunk extracted as an
    entity becomes one (type ``unknown``, no description; GraphRAG also keeps such edges). An
    entity's type is its most frequent canonical type; its chunks are those extracting it or
    naming it in a relationship. A relation is an unordered pair (``head < tail``); its ``weight``
    is its number of mentions, both directions summed (the code never parses strength, notes §1).
    """
    em = entity_mentions.assign(name=entity_mentions["name"].map(normalize_entity))
    em = em[em["name"] != ""].assign(type=lambda f: canonical_types(f["type"]))
    rm = relation_mentions.assign(source=relation_mentions["source"].map(normalize_entity),
                                  target=relation_mentions["target"].map(normalize_entity))
    rm = rm[(rm["source"] != "") & (rm["target"] != "") & (rm["source"] != rm["target"])]
    endpoints = pd.concat([rm[["chunk_id", "source"]].rename(columns={"source": "name"}),
                           rm[["chunk_id", "target"]].rename(columns={"target": "name"})])
    named = pd.concat([em[["chunk_id", "name"]], endpoints], ignore_index=True)
    names = np.sort(named["name"].unique()).astype(object)
    ids = pd.Series(np.arange(len(names), dtype=np.int64), index=pd.Index(names))
    entities = entity_frame(names, majority_label(em, "name", "type"), pd.Series(dtype=object),
                            chunk_lists(named, "name"))
    descs = distinct_descriptions(em, "name").reindex(names)
    entities = entities.drop(columns="description").assign(
        descriptions=pd.Series([d if isinstance(d, list) else [] for d in descs.tolist()], dtype=object))
    s, t = ids.reindex(rm["source"]).to_numpy(), ids.reindex(rm["target"]).to_numpy()
    pairs = pd.DataFrame({"head": np.minimum(s, t), "tail": np.maximum(s, t),
                          "description": rm["description"].to_numpy(dtype=object)})
    weight = pairs.groupby(["head", "tail"], sort=True).size()
    rdesc = distinct_descriptions(pairs, ["head", "tail"]).reindex(weight.index)
    relations = relation_frame(weight.index.get_level_values(0).to_numpy(), weight.index.get_level_values(1).to_numpy(),
                               [""] * len(weight), weight.to_numpy()).drop(columns="description")
    relations["descriptions"] = pd.Series([d if isinstance(d, list) else [] for d in rdesc.tolist()], dtype=object)
    return MergedKG(entities, relations)


@dataclass(frozen=True)
class DescribeRequest:
    """One entity or relation whose two or more distinct descriptions the LLM consolidates."""

    kind: str  # entity | relation
    row: int   # row in MergedKG.entities / .relations
    label: str  # entity name, or "head name — tail name"
    descriptions: tuple[str, ...]


def describe_requests(kg: MergedKG) -> list[DescribeRequest]:
    """Entities, then relations, with >= 2 distinct descriptions (one kept as is otherwise; notes §1)."""
    names = kg.entities["name"].to_numpy(dtype=object)
    out = [DescribeRequest("entity", i, str(names[i]), tuple(d))
           for i, d in enumerate(kg.entities["descriptions"].tolist()) if len(d) >= 2]
    heads, tails = kg.relations["head"].to_numpy(), kg.relations["tail"].to_numpy()
    out += [DescribeRequest("relation", i, f"{names[heads[i]]} — {names[tails[i]]}", tuple(d))
            for i, d in enumerate(kg.relations["descriptions"].tolist()) if len(d) >= 2]
    return out


def describe_messages(request: DescribeRequest, words: int) -> Messages:
    """Chat messages asking to consolidate one request's descriptions into one (plain text reply)."""
    what = "entity" if request.kind == "entity" else "relationship"
    system = (f"Different passages gave several descriptions of one {what} of a knowledge graph. Write a "
              f"single description of it, in the third person, that keeps every distinct fact; where the "
              f"descriptions disagree, say so instead of choosing. Use at most {words} words. Reply with "
              f"the description text only.")
    listing = "\n".join(f"- {d}" for d in request.descriptions)
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"{what.capitalize()}: {request.label}\nDescriptions:\n{listing}"}]


def describe_words(max_tokens: int) -> int:
    """Words asked of a consolidated description: half the completion budget (room for long tokens)."""
    return max(max_tokens // 2, 10)


def llm_describe(client: "LLMClient", requests: list[DescribeRequest], max_tokens: int) -> list[str]:
    """The LLM's consolidated description of each request (cached, ledger stage ``archrag_describe``)."""
    if not requests:
        return []
    msgs = [describe_messages(r, describe_words(max_tokens)) for r in requests]
    return [r.text.strip() for r in client.chat_many(msgs, stage=DESCRIBE_STAGE, max_tokens=max_tokens)]


def apply_descriptions(kg: MergedKG, requests: list[DescribeRequest], summaries: list[str]
                       ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(entities, relations)`` in the output shape: no description → "", one → kept, two or more → the
    request's summary (an empty summary falls back to the descriptions joined by newlines)."""
    out = []
    for kind, frame in (("entity", kg.entities), ("relation", kg.relations)):
        lists = frame["descriptions"].tolist()
        desc = ["\n".join(d) for d in lists]  # 0 → "", 1 → itself, >= 2 → fallback unless summarised below
        for r, s in zip(requests, summaries):
            if r.kind == kind and s:
                desc[r.row] = s
        out.append(frame.drop(columns="descriptions").assign(description=pd.Series(desc, dtype=object,
                                                                                 index=frame.index)))
    return output_frames(*out)
