"""The row caches behind ArchRAG's (and EraRAG's) summaries are keyed by everything that makes a row, so a store
that lived through another encoder, another encoder code or other entity embeddings never serves the rows those
made: a summary by its lines, title, extractive count and line embeddings; a stored embedding of a summary or
community by the model, input length, runtime, precision and the encoder's code."""
from __future__ import annotations

import dataclasses

import numpy as np

import tasks.text.embed as embed
from tasks.core.hashing import short_hash
from tasks.core.store import Store
from tasks.methods.archrag.stages import Community, summary_key
from tasks.text.embed import EmbedderParams, cached_encode, stored_code, stored_row_identity


def _community(**changes) -> Community:
    base = Community(1, 0, ("Paris (GPE): the capital", "Seine (LOC): a river", "Paris -- Seine: on"),
                     np.eye(2, 4, dtype=np.float32), 2, "Paris, Seine")
    return dataclasses.replace(base, **changes)


def test_a_summary_key_changes_with_each_thing_the_summary_is_made_from():
    base = summary_key(_community())
    assert summary_key(_community()) == base
    other_emb = np.eye(2, 4, dtype=np.float32)[::-1].copy()
    for changed in (_community(line_emb=other_emb), _community(n_extractive=1, line_emb=np.eye(1, 4, dtype=np.float32)),
                    _community(title_hint="Seine"), _community(lines=("Paris (GPE)",))):
        assert summary_key(changed) != base


def test_stored_embeddings_of_summaries_are_keyed_by_the_encoder_code_as_the_embed_stage_is(tmp_path, monkeypatch):
    params = EmbedderParams()
    assert stored_row_identity(params)["code"] == stored_code(params)
    store = Store(tmp_path)
    texts = ["Paris is on the Seine.", "Lyon is on the Rhone."]
    first = cached_encode(store, texts, params, "text_emb")
    folder = tmp_path / "_rows" / "text_emb" / short_hash({"stage": "text_emb", **stored_row_identity(params)})
    assert list(folder.glob("part-*.parquet"))
    monkeypatch.setattr(embed, "stored_code", lambda p: "another-encoder-code")
    again = cached_encode(store, texts, params, "text_emb")
    assert len(list((tmp_path / "_rows" / "text_emb").iterdir())) == 2  # the other code's rows, not these
    np.testing.assert_array_equal(first, again)
