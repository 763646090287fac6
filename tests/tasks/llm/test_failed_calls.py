"""A request that ends in an error is counted in the ledger of its stage (``llm_failed``)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tasks.llm.client import LLMClient
from tasks.llm.params import LLMParams, LLMRequestError, LLMUnreachable
from tests.llm_server import FakeLLMServer


@pytest.fixture
def server() -> Iterator[FakeLLMServer]:
    with FakeLLMServer() as srv:
        yield srv


def _client(server: FakeLLMServer, tmp_path: Path, **kw: object) -> LLMClient:
    params = dict(provider="local", model="test-model", base_url=server.base_url, timeout_s=5.0,
                  max_retries=1, backoff_base_s=0.01, backoff_max_s=0.05, concurrency=1)
    params.update(kw)
    return LLMClient(LLMParams(**params), tmp_path / "llm_cache.duckdb")  # type: ignore[arg-type]


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_an_exhausted_request_is_a_failed_call(server: FakeLLMServer, tmp_path: Path) -> None:
    client = _client(server, tmp_path)
    server.script("server_error", 2)  # the request and its one retry
    with pytest.raises(LLMUnreachable):
        client.chat(_user("lost"), stage="generate")
    assert server.requests == 2
    summary = client.ledger_summary("generate")
    assert (summary["llm_failed"], summary["llm_calls"], summary["llm_cache_hits"]) == (1, 0, 0)
    assert client.ledger.stages() == ["generate"]  # a stage with only failures still has a ledger row

    assert client.chat(_user("found"), stage="generate").text == "Echo: found"
    summary = client.ledger_summary("generate")
    assert (summary["llm_failed"], summary["llm_calls"]) == (1, 1)
    assert client.ledger_summary()["llm_failed"] == 1 and client.ledger_summary("other")["llm_failed"] == 0


def test_a_rejected_request_in_a_batch_is_counted_once(server: FakeLLMServer, tmp_path: Path) -> None:
    client = _client(server, tmp_path, max_retries=0)
    server.script("bad_request", 1)
    with pytest.raises(LLMRequestError):
        client.chat_many([_user("a"), _user("b"), _user("c")], stage="ner")
    summary = client.ledger_summary("ner")
    assert summary["llm_failed"] == 1  # queued requests cancelled after the failure are not calls
    assert summary["llm_calls"] + summary["llm_failed"] == server.requests <= 3


def test_no_failure_counts_zero(server: FakeLLMServer, tmp_path: Path) -> None:
    client = _client(server, tmp_path)
    client.chat_many([_user("a"), _user("b")], stage="s")
    assert client.ledger_summary("s")["llm_failed"] == 0 and client.ledger_summary("s")["llm_calls"] == 2
