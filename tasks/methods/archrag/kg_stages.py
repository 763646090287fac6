"""ArchRAG KG stages (paper §3.1.1): ``entities``, ``relations`` and ``kg_meta`` from the chunks.

``builder=llm`` (the paper's): a per-chunk row stage ``archrag_extract`` (cached by chunk text, so a
grown corpus extracts only its new chunks), then the merge stage ``archrag_kg_llm`` (descriptions
consolidated by the LLM, cached in the client's response cache). ``builder=cooccur`` (LLM-free, not
the paper's): the stage ``archrag_kg_cooccur`` over the shared spaCy ``ner`` mentions. The builder
is in every stage name and catalog params, so no table can pass for the other builder's.
The algorithms are in :mod:`tasks.methods.archrag.kg`.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tasks.core.code_identity import code_version
from tasks.core.row_cache import Once, text_key
from tasks.core.stage import RunContext, StageParams, input_fps, run_row_stage, run_stage, stage
from tasks.core.store import ArtifactRef, Store
from tasks.methods.archrag import kg
from tasks.text.entities import chunk_mentions
from tasks.core.limits import COUNT, PROB, one_of
from tasks.llm.params import LLMReplyParams, llm_identity
from tasks.methods.archrag.kg import BUILDERS

if TYPE_CHECKING:
    from tasks.llm.client import LLMClient
    from tasks.llm.params import LLMParams

log = logging.getLogger("dagrag.archrag")

KG_STAGES = {b: f"archrag_kg_{b}" for b in kg.BUILDERS}  # the stage (and artifact folder) of each builder
META_COUNTERS = ("chunks_extracted", "extract_calls", "extract_cache_hits", "describe_calls",
                 "describe_cache_hits", "invalid_replies", "empty_extractions", "descriptions_summarised")


@dataclass(frozen=True)
class KGParams:
    """ArchRAG KG settings. ``builder``: ``cooccur`` (spaCy co-occurrence, LLM-free, not the paper's) or
    ``llm`` (the paper's §3.1.1 extraction). ``description_tokens`` caps cooccur descriptions;
    ``max_empty_fraction``, ``describe_max_tokens`` and ``extract_max_tokens`` (completion budget of
    one chunk's JSON, which the llm group's default 512 would often truncate) are llm's."""

    builder: str = field(default="cooccur", metadata=one_of(BUILDERS))
    description_tokens: int = field(default=100, metadata=COUNT)
    max_empty_fraction: float = field(default=0.5, metadata=PROB)
    describe_max_tokens: int = field(default=300, metadata=COUNT)
    extract_max_tokens: int = field(default=1500, metadata=COUNT)

    def __post_init__(self) -> None:
        if self.description_tokens < 1 or self.describe_max_tokens < 1 or self.extract_max_tokens < 1:
            raise ValueError("description_tokens, describe_max_tokens and extract_max_tokens must be >= 1")


def kg_meta(builder: str, entities: pd.DataFrame, relations: pd.DataFrame, n_chunks: int,
            counters: dict[str, int]) -> pd.DataFrame:
    """The one-row ``kg_meta`` table (same columns for both builders; counters absent are 0)."""
    row: dict[str, Any] = {"builder": builder, "n_entities": len(entities), "n_relations": len(relations),
                           "n_chunks": n_chunks, **{c: int(counters.get(c, 0)) for c in META_COUNTERS}}
    return pd.DataFrame([row]).astype({c: "int64" for c in row if c != "builder"})


def kg_client(llm: "LLMParams | None", artifacts_dir: str) -> "LLMClient":
    """The chat client of ``builder=llm``; a clear error when no LLM is configured."""
    from tasks.llm.client import make_client

    if llm is None or llm.provider == "none":
        raise ValueError("archrag kg builder=llm extracts the graph with the chat model: configure one with "
                         "llm=local (llm.base_url=...) or llm=openai, or use builder=cooccur")
    return make_client(llm, Path(artifacts_dir) / "llm_cache.duckdb")


@dataclass(frozen=True)
class CooccurKGParams(StageParams):
    """``archrag_kg_cooccur``: the builder's name and the cap on an entity's description."""

    SOURCES = ("kg",)
    builder: str
    description_tokens: int


@dataclass(frozen=True)
class LLMKGParams(LLMReplyParams):
    """``archrag_kg_llm``: the completion budgets, the empty-reply limit, and what in the ``llm`` group changes a
    reply (never the endpoint or key)."""

    SOURCES = ("kg",)
    builder: str
    extract_max_tokens: int
    describe_max_tokens: int
    max_empty_fraction: float


@dataclass(frozen=True)
class ExtractParams(LLMReplyParams):
    """``archrag_extract``, the per-chunk extraction inside ``archrag_kg_llm`` (:meth:`of_kg` from its params)."""

    SOURCES = ("kg",)
    builder: str
    extract_max_tokens: int
    max_empty_fraction: float

    @classmethod
    def of_kg(cls, params: LLMKGParams) -> "ExtractParams":
        return cls(**{f.name: getattr(params, f.name) for f in dataclasses.fields(cls)})


class ExtractCount:
    """How many chunks the extraction stage sent to the model (a plain object: the task runner passes it as is)."""

    def __init__(self) -> None:
        self.chunks_extracted = 0


def kg_params(config: Any) -> "CooccurKGParams | LLMKGParams":
    """The KG stage's params for ``config.kg.builder``: the projection a flow hands :func:`archrag_kg`."""
    return (CooccurKGParams if config.kg.builder == "cooccur" else LLMKGParams).of(config)


def archrag_kg(ctx: RunContext, params: "CooccurKGParams | LLMKGParams", documents: ArtifactRef, chunks: ArtifactRef,
               mentions: ArtifactRef | None, llm: LLMParams | None = None) -> dict[str, ArtifactRef]:
    """ArchRAG's KG ``{"entities", "relations", "kg_meta"}`` by the builder these params are for (:func:`kg_params`).

    ``mentions`` (the shared ``ner`` stage's document mentions) is required by ``cooccur`` and
    ignored by ``llm``; ``llm`` needs a configured chat model (the ``llm`` group). ``documents`` is recorded as an
    input (chunks and mentions derive from it).
    """
    if isinstance(params, CooccurKGParams):
        if mentions is None:
            raise ValueError("archrag kg builder=cooccur needs the ner stage's mentions")
        return cooccur_stage(ctx, params, documents, chunks, mentions)
    if llm is None:
        raise TypeError("archrag kg builder=llm needs the llm group's settings: archrag_kg(..., cfg.llm)")
    return llm_stage(ctx, params, documents, chunks, llm)


@stage(KG_STAGES["cooccur"], params=CooccurKGParams)
def cooccur_stage(ctx: RunContext, params: CooccurKGParams, documents: ArtifactRef, chunks: ArtifactRef,
                  mentions: ArtifactRef) -> dict[str, ArtifactRef]:
    """``archrag_kg_cooccur``: :func:`kg.cooccur_kg` over the chunk mentions (LLM-free, not the paper's)."""
    def compute() -> tuple[dict[str, pa.Table | pd.DataFrame], int]:
        ch = Store.read(chunks, ["chunk_id", "doc_id", "text", "start", "end"])
        cm = chunk_mentions(Store.read(mentions, ["doc_id", "surface", "label", "start", "end", "entity"]), ch)
        entities, relations = kg.cooccur_kg(ch, cm, params.description_tokens)
        empty = len(ch) - int(cm["chunk_id"].nunique())
        meta = kg_meta("cooccur", entities, relations, len(ch), {"empty_extractions": empty})
        ent, rel = kg.to_arrow(entities, relations)
        return {"entities": ent, "relations": rel, "kg_meta": meta}, len(entities)

    return run_stage(ctx, params, input_fps(documents=documents, chunks=chunks, mentions=mentions), compute)


@stage(kg.EXTRACT_STAGE, params=ExtractParams)
def extract_stage(ctx: RunContext, params: ExtractParams, documents: ArtifactRef, chunks: ArtifactRef,
                  llm: "LLMParams", client: "LLMClient", counts: "ExtractCount") -> dict[str, ArtifactRef]:
    """``archrag_extract``: the raw records of every chunk (``extractions``: ``chunk_id`` + the columns of
    :data:`kg.EXTRACTION_SCHEMA`), extracted once per distinct chunk text under this model and prompt.

    A batch of new chunks more than ``max_empty_fraction`` of which give no entity raises before
    its rows are stored (so a fixed model re-asks them); under ``ctx.llm_dry_run`` a batch with
    new chunks raises ``LLMDryRun`` with its estimate instead of calling the LLM. ``llm`` and ``client``
    are the service (what in them changes a reply is in ``params``); ``counts`` receives the chunks extracted.
    """
    from tasks.llm.params import LLMDryRun
    from tasks.llm.schema import JSON_FORMAT, check_empty_fraction


    @Once
    def read() -> tuple[pd.DataFrame, pd.Series]:  # only when the stage computes (a cached one reads nothing)
        frame = Store.read(chunks, ["chunk_id", "text"])
        return frame, frame["text"].map(text_key)

    def compute_rows(missing: list[str]) -> pa.Table:
        frame, keys = read()
        texts = frame.assign(key=keys).drop_duplicates("key").set_index("key").loc[missing, "text"].tolist()
        if ctx.llm_dry_run:
            fmt = {"response_format": JSON_FORMAT} if params.json_mode else {}
            msgs = [kg.extract_messages(t) for t in texts]
            raise LLMDryRun(kg.EXTRACT_STAGE, client.dry_run_estimate(msgs, params.extract_max_tokens,
                                                                       max_tokens=params.extract_max_tokens, **fmt))
        replies = kg.llm_extract(client, texts, params.extract_max_tokens)
        rows = kg.extraction_rows(missing, replies)
        check_empty_fraction([r if r is None else r.get("entities") for r in replies], params.max_empty_fraction,
                             f"{kg.EXTRACT_STAGE} (archrag kg builder=llm)")
        counts.chunks_extracted += len(missing)
        return rows

    def assemble(rows: pa.Table | None) -> dict[str, pd.DataFrame]:
        frame, keys = read()
        if rows is None:
            cached = kg.EXTRACTION_SCHEMA.empty_table().to_pandas()
        else:
            cached = rows.to_pandas().set_index("key").loc[keys.tolist()].reset_index(drop=True)
        cached.insert(0, "chunk_id", frame["chunk_id"].to_numpy())
        return {"extractions": cached.drop(columns="key", errors="ignore")}

    row_params = {"builder": "llm", "llm": llm_identity(params), "max_tokens": params.extract_max_tokens,
                  "code": code_version(kg.llm_extract, kg.extraction_rows)}
    return run_row_stage(ctx, params, row_params, input_fps(documents=documents, chunks=chunks), lambda: read()[1],
                         compute_rows,
                         "key", assemble)


@stage(KG_STAGES["llm"], params=LLMKGParams)
def llm_stage(ctx: RunContext, params: LLMKGParams, documents: ArtifactRef, chunks: ArtifactRef,
              llm: "LLMParams | None") -> dict[str, ArtifactRef]:
    """``archrag_kg_llm``: merge the chunks' extractions (:func:`kg.merge_extractions`) and let the LLM
    consolidate every entity or relation with two or more distinct descriptions (§3.1.1). ``llm`` is the
    service it calls (what in it changes a reply is in ``params``)."""
    from tasks.llm.client import ledger_rows
    from tasks.llm.params import LLMDryRun

    client = kg_client(llm, ctx.artifacts_dir)
    with ledger_rows(ctx.store, ctx.run_id, client, kg.EXTRACT_STAGE, kg.DESCRIBE_STAGE):
        counts = ExtractCount()
        extractions = extract_stage(ctx, ExtractParams.of_kg(params), documents, chunks, llm, client,
                                    counts)["extractions"]
        counters: dict[str, int] = {"chunks_extracted": counts.chunks_extracted} if counts.chunks_extracted else {}

        def compute() -> tuple[dict[str, pa.Table | pd.DataFrame], int]:
            ext = Store.read(extractions)
            merged = kg.merge_extractions(*kg.extraction_mentions(ext))
            requests = kg.describe_requests(merged)
            if ctx.llm_dry_run:
                words = kg.describe_words(params.describe_max_tokens)
                estimate = client.dry_run_estimate([kg.describe_messages(r, words) for r in requests],
                                                   params.describe_max_tokens, max_tokens=params.describe_max_tokens)
                if estimate["calls"]:
                    raise LLMDryRun(kg.DESCRIBE_STAGE, estimate)
            summaries = kg.llm_describe(client, requests, params.describe_max_tokens)
            entities, relations = kg.apply_descriptions(merged, requests, summaries)
            ex, de = client.ledger_summary(kg.EXTRACT_STAGE), client.ledger_summary(kg.DESCRIBE_STAGE)
            n_ent = ext["ent_name"].map(len).to_numpy() if len(ext) else np.zeros(0, np.int64)
            counters.update(extract_calls=ex["llm_calls"], extract_cache_hits=ex["llm_cache_hits"],
                            describe_calls=de["llm_calls"], describe_cache_hits=de["llm_cache_hits"],
                            invalid_replies=int(ext["invalid"].sum()), empty_extractions=int((n_ent == 0).sum()),
                            descriptions_summarised=len(requests))
            meta = kg_meta("llm", entities, relations, len(ext), counters)
            ent, rel = kg.to_arrow(entities, relations)
            return {"entities": ent, "relations": rel, "kg_meta": meta}, len(entities)

        return run_stage(ctx, params, input_fps(documents=documents, chunks=chunks, extractions=extractions), compute)
