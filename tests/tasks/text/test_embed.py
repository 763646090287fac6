"""Embedding: batches in length order give each text the embedding a single encoder call gives it, in input
order, and a bar shows progress at any size once the run lasts longer than the bar's delay."""
from __future__ import annotations

import numpy as np

from tasks.core import progress
from tasks.text.embed import EmbedderParams, encode
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
