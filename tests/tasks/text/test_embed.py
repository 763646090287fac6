"""Embedding: batches in length order give each text the embedding a single encoder call gives it, in input
order, and a bar shows progress at any size once the run lasts longer than the bar's delay. The embed stage's
identity is what its values depend on: settings that only batch the work or serve the questions keep it."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pandas as pd

from tasks.core import progress
from tasks.core.stage import RunContext
from tasks.core.files import write_parquet
from tasks.core.hashing import short_hash
from tasks.core.store import ArtifactRef
from tasks.text.embed import EmbedParams, EmbedderParams, embed, encode, load_embeddings
from tasks.text.encoder import load_encoder

TEXTS = ["Paris is the capital of France.", "Ok.", "The Louvre, in Paris, is the world's most-visited museum.",
         "Rome", "Berlin is a city in Germany with a long and eventful history."]


def test_batches_keep_input_order_and_values():
    params = EmbedderParams(batch_size=2)
    emb = encode(TEXTS, params)
    whole = load_encoder(params.model, params.max_seq_length, params.device).encode(
        TEXTS, batch_size=8, normalize_embeddings=True, convert_to_numpy=True)
    assert emb.shape == (5, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(emb, whole, atol=1e-5)
    assert encode([], params).shape == (0, 384)


def test_a_small_embedding_run_shows_progress(capsys, monkeypatch):
    params = EmbedderParams(batch_size=2)
    monkeypatch.setattr(progress, "DELAY_S", 0.0)  # as if the batches took longer than the bar's delay
    encode(TEXTS, params)
    assert "embed:" in capsys.readouterr().err
    encode(TEXTS, params, query=True)  # online questions: never a bar
    assert "embed" not in capsys.readouterr().err


def _table(ctx: RunContext) -> ArtifactRef:
    docs = pd.DataFrame({"doc_id": [f"d{i}" for i in range(len(TEXTS))], "title": [f"T{i}" for i in range(len(TEXTS))],
                         "text": TEXTS})
    fp = short_hash(docs["doc_id"].tolist())
    path = ctx.store.path_for(ctx.dataset, "ingest", "documents", fp)
    return ArtifactRef("documents", str(path), fp, write_parquet(docs, path))


def _embed(ctx: RunContext, table: ArtifactRef, embedder: EmbedderParams, use_template: bool = False) -> ArtifactRef:
    """The embed stage with the params a flow projects from this ``embedder`` group."""
    params = EmbedParams.of(SimpleNamespace(embedder=embedder), id_col="doc_id", use_template=use_template)
    return embed.fn(ctx, params, table)["embeddings"]


def test_batching_and_query_settings_keep_the_stored_embeddings(ctx):
    table, base = _table(ctx), EmbedderParams(batch_size=2)
    first = _embed(ctx, table, base)
    for same in (replace(base, batch_size=16), replace(base, query_batch_size=4, query_runtime="torch")):
        again = _embed(RunContext(ctx.artifacts_dir, "ds", "run2"), table, same)
        assert again.fp == first.fp  # cached: nothing downstream of the embeddings runs again
    shorter = _embed(ctx, table, replace(base, max_seq_length=4))
    templated = _embed(ctx, table, base, use_template=True)
    assert len({first.fp, shorter.fp, templated.fp}) == 3
    emb = {ref.fp: load_embeddings(ref, "doc_id")[1] for ref in (first, shorter, templated)}
    np.testing.assert_allclose(emb[first.fp], encode(TEXTS, base), atol=1e-5)
    assert not np.allclose(emb[first.fp], emb[templated.fp], atol=1e-3)  # "T0\nParis ..." is another text
    statuses = ctx.store.query("SELECT status FROM stage_events WHERE stage = 'embed' ORDER BY created_at")
    assert statuses["status"].tolist() == ["computed", "cached", "cached", "computed", "computed"]
