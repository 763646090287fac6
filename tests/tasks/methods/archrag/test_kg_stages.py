"""ArchRAG KG stages end to end: cooccur over the spaCy ner stage, llm against a local fake chat server."""
from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest

from tasks.core.config_check import check_values

from tasks.data.ingest import SampleParams, ingest
from tasks.core.stage import RunContext
from tasks.core.files import write_parquet
from tasks.core.hashing import short_hash
from tasks.core.store import ArtifactRef, Store
from tasks.llm.params import ExtractionMostlyEmpty, LLMDryRun, LLMParams
from tasks.methods.archrag import kg
from tasks.methods.archrag.stages import KG_STAGES, META_COUNTERS, archrag_kg
from tasks.methods.archrag.params import KGParams, kg_params
from tasks.text.chunk import ChunkParams, chunk
from tasks.text.entities import chunk_mentions
from tasks.llm.ner_backends import ner, ner_params
from tasks.text.ner import NERParams, normalize_entity
from tests.llm_server import FakeLLMServer

PASSAGES = ChunkParams(unit="passage")


def _kg(ctx: RunContext, docs: ArtifactRef, chunks: ArtifactRef, mentions: ArtifactRef | None, params: KGParams,
        llm: LLMParams | None) -> dict[str, ArtifactRef]:
    """The KG stages a flow runs for this ``kg`` group and ``llm`` group."""
    return archrag_kg(ctx, kg_params(SimpleNamespace(kg=params, llm=llm)), docs, chunks, mentions, llm)


@pytest.fixture(scope="module")
def sample_docs(tmp_path_factory) -> pd.DataFrame:
    """The generated sample's 20 documents (the smallest sample)."""
    ctx = RunContext(str(tmp_path_factory.mktemp("ingest")), "ds", "ingest")
    return Store.read(ingest(ctx, SampleParams(n_passages=20, n_questions=5), "")["documents"])


def _documents(ctx: RunContext, docs: pd.DataFrame) -> ArtifactRef:
    fp = short_hash(docs["doc_id"].tolist())
    path = ctx.store.path_for(ctx.dataset, "ingest", "documents", fp)
    return ArtifactRef("documents", str(path), fp, write_parquet(docs.reset_index(drop=True), path))


def _rows_computed(ctx: RunContext, stage: str, ref: ArtifactRef) -> int:
    return int(ctx.store.query("SELECT rows_computed FROM stages WHERE stage = ? AND fp = ?",
                               [stage, ref.fp])["rows_computed"].iloc[0])


def _check_shape(refs: dict[str, ArtifactRef], builder: str, chunk_ids: set[str]) -> tuple[pd.DataFrame, ...]:
    assert set(refs) == {"entities", "relations", "kg_meta"}
    assert Store.read_arrow(refs["entities"]).schema.remove_metadata() == kg.ENTITY_SCHEMA
    assert Store.read_arrow(refs["relations"]).schema.remove_metadata() == kg.RELATION_SCHEMA
    assert all(KG_STAGES[builder] in r.path for r in refs.values())  # the builder is in every artifact's stage
    ent, rel, meta = (Store.read(refs[k]) for k in ["entities", "relations", "kg_meta"])
    assert ent["entity_id"].tolist() == list(range(len(ent)))
    assert ent["name"].tolist() == sorted(ent["name"]) and ent["name"].is_unique
    assert all(normalize_entity(n) == n and n for n in ent["name"])
    assert all(list(c) == sorted(set(c)) and set(c) <= chunk_ids for c in ent["chunk_ids"])
    assert ent["n_chunks"].tolist() == [len(c) for c in ent["chunk_ids"]]
    assert (rel["head"] < rel["tail"]).all() and not rel.duplicated(["head", "tail"]).any()
    assert rel["tail"].max() < len(ent) and (rel["weight"] >= 1).all()
    assert list(meta.columns) == ["builder", "n_entities", "n_relations", "n_chunks", *META_COUNTERS]
    assert meta.iloc[0][["builder", "n_entities", "n_relations", "n_chunks"]].tolist() == [
        builder, len(ent), len(rel), len(chunk_ids)]
    return ent, rel, meta


# ----------------------------------------------------------------------------- cooccur

def test_cooccur_stage_end_to_end(ctx, sample_docs) -> None:
    docs = _documents(ctx, sample_docs)
    chunks = chunk.fn(ctx, ChunkParams(unit="window", window_tokens=40, overlap_tokens=10), docs)["chunks"]
    mentions = ner(ctx, ner_params(SimpleNamespace(ner=NERParams()), "doc_id"), docs)["mentions"]
    params = KGParams(builder="cooccur", description_tokens=30)
    refs = _kg(ctx, docs, chunks, mentions, params, None)
    ch = Store.read(chunks)
    ent, rel, meta = _check_shape(refs, "cooccur", set(ch["chunk_id"]))
    assert len(ent) > 10 and len(rel) > 10
    assert (ent["description"].str.split().str.len() <= 30).all()
    cm = chunk_mentions(Store.read(mentions), ch)
    expected = kg.cooccur_kg(ch, cm, 30)
    pd.testing.assert_frame_equal(ent, expected[0], check_dtype=False)
    pd.testing.assert_frame_equal(rel, expected[1], check_dtype=False)
    assert meta["empty_extractions"].iloc[0] == len(ch) - cm["chunk_id"].nunique()
    row = ctx.store.query("SELECT params FROM stages WHERE stage = ?", [KG_STAGES["cooccur"]])
    assert json.loads(row["params"].iloc[0]) == {"builder": "cooccur", "description_tokens": 30}

    again = _kg(RunContext(ctx.artifacts_dir, ctx.dataset, "run2"), docs, chunks, mentions, params, None)
    assert again == refs and ctx.store.events("run2")["status"].tolist() == ["cached"]
    with pytest.raises(ValueError, match="mentions"):
        _kg(ctx, docs, chunks, None, params, None)


# ----------------------------------------------------------------------------- llm

_CAP = re.compile(r"\b[A-Z][a-z]+\b")


def extraction_reply(passage: str) -> str:
    """The fake model's extraction: capitalised words as entities (described by the passage's opening,
    so an entity in two passages gets two descriptions), consecutive ones as relationships."""
    names = list(dict.fromkeys(_CAP.findall(passage)))
    ents = [{"name": n, "type": "person" if i % 2 else "location", "description": f"{n}, named in '{passage[:25]}'"}
            for i, n in enumerate(names)]
    rels = [{"source": a, "target": b, "description": f"{a} comes before {b}", "strength": 5}
            for a, b in zip(names, names[1:])]
    return json.dumps({"entities": ents, "relationships": rels})


def _first_user(body: dict[str, Any]) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def responder(body: dict[str, Any]) -> str:
    user = _first_user(body)
    if "\nDescriptions:\n" in user:
        return f"Consolidated: {user.splitlines()[0]}"
    return extraction_reply(user.split("Passage:\n", 1)[1])


def _is_extraction(body: dict[str, Any]) -> bool:
    return _first_user(body).startswith("Passage:\n")


def _counts(server: FakeLLMServer) -> tuple[int, int]:
    """(extraction requests, describe requests) received so far."""
    with server.stats.lock:
        bodies = list(server.stats.bodies)
    n = sum(map(_is_extraction, bodies))
    return n, len(bodies) - n


def _llm(server: FakeLLMServer) -> LLMParams:
    return LLMParams(provider="local", model="fake", base_url=server.base_url)


LLM_KG = KGParams(builder="llm")


def test_llm_stage_end_to_end_cached_and_grown(ctx, sample_docs) -> None:
    small = sample_docs.iloc[:14]
    with FakeLLMServer(responder=responder) as server:
        llm = _llm(server)
        docs = _documents(ctx, small)
        chunks = chunk.fn(ctx, PASSAGES, docs)["chunks"]
        refs = _kg(ctx, docs, chunks, None, LLM_KG, llm)
        ent, rel, meta = _check_shape(refs, "llm", set(Store.read(chunks)["chunk_id"]))
        n_extract, n_describe = _counts(server)
        assert n_extract == 14 and n_describe > 0
        m = meta.iloc[0]
        assert (m["chunks_extracted"], m["extract_calls"], m["invalid_replies"]) == (14, 14, 0)
        assert m["describe_calls"] == m["descriptions_summarised"] == n_describe
        summarised = ent["description"].str.startswith("Consolidated: Entity: ")
        assert summarised.sum() + rel["description"].str.startswith("Consolidated: Relationship: ").sum() == n_describe
        assert set(ent.loc[summarised, "type"]) <= set(kg.ENTITY_TYPES) and len(ent) > 20 and len(rel) > 20
        row = ctx.store.query("SELECT params FROM stages WHERE stage = ?", [KG_STAGES["llm"]])
        assert json.loads(row["params"].iloc[0])["builder"] == "llm"
        ledger = ctx.store.query("SELECT stage, llm_calls FROM llm_ledger WHERE run_id = 'run1' ORDER BY stage")
        assert ledger.values.tolist() == [[kg.DESCRIBE_STAGE, n_describe], [kg.EXTRACT_STAGE, 14]]

        # the same corpus again: both stages are catalog hits, no request
        before = server.requests
        again = _kg(RunContext(ctx.artifacts_dir, ctx.dataset, "run2"), docs, chunks, None, LLM_KG, llm)
        assert again == refs and server.requests == before

        # a grown corpus: only the 6 new chunks are extracted
        full_docs = _documents(ctx, sample_docs)
        full_chunks = chunk.fn(ctx, PASSAGES, full_docs)["chunks"]
        grown = _kg(RunContext(ctx.artifacts_dir, ctx.dataset, "run3"), full_docs, full_chunks, None,
                              LLM_KG, llm)
        n_extract2, n_describe2 = _counts(server)
        assert n_extract2 - n_extract == 6
        extract_ref = ctx.store.query("SELECT fp FROM stages WHERE stage = ? ORDER BY created_at DESC LIMIT 1",
                                      [kg.EXTRACT_STAGE])["fp"].iloc[0]
        assert _rows_computed(ctx, kg.EXTRACT_STAGE, ArtifactRef("x", "", extract_ref, 0)) == 6
        gmeta = Store.read(grown["kg_meta"]).iloc[0]
        assert gmeta["chunks_extracted"] == 6 and gmeta["describe_calls"] == n_describe2 - n_describe
        assert gmeta["describe_cache_hits"] > 0  # unchanged description sets are not asked again

    # the grown graph equals a fresh build of the full corpus
    with FakeLLMServer(responder=responder) as server:
        fresh_ctx = RunContext(ctx.artifacts_dir + "-fresh", ctx.dataset, "fresh")
        fdocs = _documents(fresh_ctx, sample_docs)
        fresh = _kg(fresh_ctx, fdocs, chunk.fn(fresh_ctx, PASSAGES, fdocs)["chunks"], None, LLM_KG,
                              _llm(server))
        assert _counts(server)[0] == 20
    for name in ["entities", "relations"]:
        pd.testing.assert_frame_equal(Store.read(grown[name]), Store.read(fresh[name]))


def test_llm_all_empty_extraction_raises_and_stores_nothing(ctx, sample_docs) -> None:
    docs = _documents(ctx, sample_docs.iloc[:5])
    chunks = chunk.fn(ctx, PASSAGES, docs)["chunks"]
    with FakeLLMServer(responder=lambda body: '{"entities": [], "relationships": []}') as server:
        with pytest.raises(ExtractionMostlyEmpty, match=kg.EXTRACT_STAGE):
            _kg(ctx, docs, chunks, None, LLM_KG, _llm(server))
        assert server.requests == 5
    assert not list((ctx.store.root / "_rows" / kg.EXTRACT_STAGE).rglob("*.parquet"))
    with FakeLLMServer(responder=responder) as server:  # another model name: the failed batch is asked again
        refs = _kg(ctx, docs, chunks, None, LLM_KG, LLMParams(provider="local", model="fixed",
                                                                        base_url=server.base_url))
        assert _counts(server)[0] == 5 and Store.read(refs["entities"]).shape[0] > 0


def test_llm_dry_run_estimates_without_requests(ctx, sample_docs) -> None:
    dry = RunContext(ctx.artifacts_dir, ctx.dataset, "dry", llm_dry_run=True)
    small, full = _documents(ctx, sample_docs.iloc[:5]), _documents(ctx, sample_docs.iloc[:8])
    small_chunks, full_chunks = (chunk.fn(ctx, PASSAGES, d)["chunks"] for d in (small, full))
    with FakeLLMServer(responder=responder) as server:
        llm = _llm(server)
        with pytest.raises(LLMDryRun) as stop:
            _kg(dry, small, small_chunks, None, LLM_KG, llm)
        assert stop.value.stage == kg.EXTRACT_STAGE and stop.value.estimate["calls"] == 5
        assert server.requests == 0
        assert not ctx.store.query("SELECT * FROM stages WHERE stage LIKE 'archrag%'").shape[0]

        _kg(ctx, small, small_chunks, None, LLM_KG, llm)  # real build of 5 chunks
        sent = server.requests
        with pytest.raises(LLMDryRun) as stop:  # grown corpus: only the 3 new chunks are counted
            _kg(dry, full, full_chunks, None, LLM_KG, llm)
        assert stop.value.estimate["calls"] == 3 and server.requests == sent

        # extractions cached, descriptions asked with a new budget: the describe calls are counted, not sent
        wider = KGParams(builder="llm", describe_max_tokens=200)
        with pytest.raises(LLMDryRun) as stop:
            _kg(dry, small, small_chunks, None, wider, llm)
        n_describe = _counts(server)[1]
        assert stop.value.stage == kg.DESCRIBE_STAGE and stop.value.estimate["calls"] == n_describe > 0
        assert server.requests == sent
        assert _kg(dry, small, small_chunks, None, LLM_KG, llm)  # everything cached: no stop


def test_llm_builder_needs_a_configured_model(ctx, sample_docs) -> None:
    docs = _documents(ctx, sample_docs.iloc[:2])
    chunks = chunk.fn(ctx, PASSAGES, docs)["chunks"]
    with pytest.raises(ValueError, match="builder=llm"):
        _kg(ctx, docs, chunks, None, LLM_KG, LLMParams())
    with pytest.raises(ValueError, match="builder"):  # the config check, from the field's metadata
        check_values(KGParams, "kg", {"builder": "graphrag"})
