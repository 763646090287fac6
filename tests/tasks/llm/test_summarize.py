"""Tests for tasks.llm.summarize: the extractive summary, and the LLM summariser through the response
cache and the token ledger (against the fake OpenAI-compatible server)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tasks.llm.client import LLMClient
from tasks.llm.params import ExtractionMostlyEmpty, LLMParams, LLMResult, Messages
from tasks.llm.summarize import (
    SummaryRequest,
    dry_run_summariser,
    extractive_summariser,
    extractive_summary,
    llm_summariser,
    make_summariser,
)
from tasks.text.sentences import split_sentences
from tests.llm_server import FakeLLMServer

TEXTS = [("Dr. Ada Lovelace wrote notes. They described an engine.", "Babbage built it. It computed tables."),
         ("Paris is in France. It is large.",),
         ("Oslo hosts The Scream. It is cold in Jan. and Feb. there.", "Munch painted it.")]


def _requests(d: int = 4) -> list[SummaryRequest]:
    rng = np.random.default_rng(0)
    return [SummaryRequest(f"n{i}", 1, tuple(f"c{i}{j}" for j in range(len(t))), t,
                           rng.standard_normal((len(t), d)).astype(np.float32)) for i, t in enumerate(TEXTS)]


def _embed(calls: list[int] | None = None):
    def embed(texts: list[str]) -> np.ndarray:
        if calls is not None:
            calls.append(len(texts))
        return np.stack([np.random.default_rng(len(t)).standard_normal(4) for t in texts]).astype(np.float32)
    return embed


def _prompt(child_texts: tuple[str, ...], words: int) -> Messages:
    return [{"role": "user", "content": f"In {words} words: " + " | ".join(child_texts)}]


# ---------------------------------------------------------------- extractive


def test_extractive_summary_keeps_order_and_budget():
    texts = ["Alpha one. Alpha two is longer here.", "Beta one! Beta two?", "Gamma one. Gamma two."]
    emb = np.array([[1, 0], [0.9, 0.1], [0, 1]], dtype=np.float32)
    out = extractive_summary(texts, emb, max_tokens=6)
    assert len(out.split()) <= 6
    assert out == "Alpha one. Beta one! Gamma one."  # lead sentences first, original order
    sents = [s for t in texts for s in split_sentences(t)]
    sent_emb = np.array([[0, 1]] * len(sents), dtype=np.float32)
    sent_emb[3] = [1, 0.2]  # "Beta two?" is closest to the centroid
    assert extractive_summary(texts, emb, 2, sentence_emb=sent_emb) == "Beta two?"
    assert extractive_summary(["a b c d e f"], emb[:1], 3) == "a b c"
    assert extractive_summary([], emb[:0], 3) == "" and extractive_summary(["x."], emb[:1], 0) == ""


def test_extractive_summary_splits_with_the_one_splitter():
    out = extractive_summary(["Dr. Smith met J. R. Doe. They talked."], np.ones((1, 2), np.float32), 6)
    assert out == "Dr. Smith met J. R. Doe."  # abbreviations and initials do not end a sentence


@pytest.mark.parametrize("embed_sentences", [True, False])
def test_extractive_summariser_batches_and_embeds(embed_sentences):
    calls: list[int] = []
    reqs = _requests()
    texts, emb = extractive_summariser(8, _embed(calls), embed_sentences=embed_sentences)(reqs)
    n_sents = sum(len(split_sentences(t)) for r in reqs for t in r.child_texts)
    assert calls == ([n_sents] if embed_sentences else []) + [len(reqs)]  # one sentence batch, one summary batch
    for r, t in zip(reqs, texts):
        pool = {s for c in r.child_texts for s in split_sentences(c)}
        assert t and set(split_sentences(t)) <= pool and len(t.split()) <= 8
    assert emb.shape == (3, 4) and np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
    _, centroid = extractive_summariser(8)(reqs)  # no encoder: the normalised child centroid
    want = np.stack([(r.child_emb / np.linalg.norm(r.child_emb, axis=1, keepdims=True)).mean(0) for r in reqs])
    assert np.allclose(centroid, want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-6)


# ---------------------------------------------------------------- LLM


def _client(server: FakeLLMServer, tmp_path: Path) -> LLMClient:
    params = LLMParams(provider="local", model="test-model", base_url=server.base_url, timeout_s=5.0,
                       max_retries=1, backoff_base_s=0.01, concurrency=2)
    return LLMClient(params, tmp_path / "llm_cache.duckdb")


def test_llm_summariser_goes_through_cache_and_ledger(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    reqs = _requests()
    summarise = make_summariser("llm", 30, _embed(), client=_client(llm_server, tmp_path), prompt=_prompt,
                                stage="test_summary")
    texts, emb = summarise(reqs)
    assert llm_server.requests == 3 and emb.shape == (3, 4)
    assert texts == [f"Echo: In 30 words: {' | '.join(t)}" for t in TEXTS]  # stripped replies, in order
    assert all(b["max_tokens"] == 60 for b in llm_server.stats.bodies)  # twice the words asked for

    again = _client(llm_server, tmp_path)  # a fresh client on the same cache file
    texts2, emb2 = llm_summariser(again, _prompt, 30, "test_summary", _embed())(reqs)
    assert llm_server.requests == 3  # zero HTTP calls the second time
    assert texts2 == texts and np.array_equal(emb2, emb)
    ledger = again.ledger_summary("test_summary")
    assert ledger["llm_cache_hits"] == 3 and ledger["llm_calls"] == 0 and ledger["prompt_tokens"] == 0


def test_dry_run_summariser_estimates_misses_and_answers_with_the_stand_in(llm_server: FakeLLMServer,
                                                                           tmp_path: Path) -> None:
    client = _client(llm_server, tmp_path)
    reqs = _requests()
    llm_summariser(client, _prompt, 30, "s", _embed())(reqs[:1])  # one group already cached
    stand_in = extractive_summariser(30)
    summarise, total = dry_run_summariser(client, _prompt, 30, stand_in)
    texts, _ = summarise(reqs)
    assert texts == stand_in(reqs)[0]
    assert total["calls"] == 2 and total["completion_tokens"] == 2 * 60 and total["prompt_tokens"] > 0
    assert llm_server.requests == 1  # the dry run sent nothing


class _EmptyReplies:
    """A client whose every reply is blank."""

    def chat_many(self, msgs: list[Messages], stage: str, **sampling: object) -> list[LLMResult]:
        return [LLMResult("  ", 1, 0, False, 0.0) for _ in msgs]


def test_llm_summariser_refuses_mostly_empty_replies() -> None:
    with pytest.raises(ExtractionMostlyEmpty, match="my_stage"):
        llm_summariser(_EmptyReplies(), _prompt, 30, "my_stage", _embed())(_requests())  # type: ignore[arg-type]


def test_make_summariser_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="kind"):
        make_summariser("abstractive", 30, None)
    with pytest.raises(ValueError, match="client, prompt, stage"):
        make_summariser("llm", 30, _embed(), prompt=_prompt, stage="s")
    texts, _ = make_summariser("extractive", 4, None)(_requests())
    assert texts[1] == "Paris is in France."
