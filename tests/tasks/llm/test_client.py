"""Tests for tasks.llm.client (and its transport, ledger and structured outputs) against a real local
OpenAI-compatible HTTP server."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import pytest

from tasks.core.config_check import check_values

from tasks.core import progress
from tasks.llm.client import LLMClient, make_client
from tasks.llm.ledger import estimate_tokens
from tasks.llm.params import (
    ExtractionMostlyEmpty,
    LLMBadResponse,
    LLMConfigError,
    LLMParams,
    LLMRequestError,
    LLMUnreachable,
)
from tasks.llm.schema import check_empty_fraction
from tests.llm_server import FakeLLMServer

ENTITY_SCHEMA = {"type": "object", "required": ["entities"],
                 "properties": {"entities": {"type": "array", "items": {"type": "string"}}}}


def _params(base_url: str, **kw: object) -> LLMParams:
    defaults: dict[str, object] = dict(provider="local", model="test-model", base_url=base_url,
                                       timeout_s=5.0, max_retries=3, backoff_base_s=0.01,
                                       backoff_max_s=2.0, concurrency=4)
    defaults.update(kw)
    return LLMParams(**defaults)  # type: ignore[arg-type]


def _client(server: FakeLLMServer, tmp_path: Path, **kw: object) -> LLMClient:
    return LLMClient(_params(server.base_url, **kw), tmp_path / "llm_cache.duckdb")


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- normal operation ---------------------------------------------------------
def test_chat_answers_and_ledger(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    client = _client(llm_server, tmp_path)
    res = client.chat(_user("Question: which city hosts Louvre"), stage="qa")
    assert res.text.endswith("Answer: Louvre")
    # fake usage = word counts: 5 prompt words, "Let me think step by step. / Answer: Louvre" = 8
    assert (res.prompt_tokens, res.completion_tokens, res.cached) == (5, 8, False)
    summary = client.ledger_summary("qa")
    assert summary["llm_calls"] == 1 and summary["llm_cache_hits"] == 0
    assert summary["prompt_tokens"] == 5 and summary["completion_tokens"] == 8
    assert llm_server.stats.bodies[0]["temperature"] == 0.0
    assert llm_server.stats.bodies[0]["max_tokens"] == 512


def test_chat_many_preserves_order(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    client = _client(llm_server, tmp_path, concurrency=4)
    prompts = [f"item {i}" for i in range(20)]
    results = client.chat_many([_user(p) for p in prompts], stage="echo")
    assert [r.text for r in results] == [f"Echo: {p}" for p in prompts]
    assert llm_server.requests == 20


def test_duplicate_requests_are_sent_once(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    client = _client(llm_server, tmp_path)
    results = client.chat_many([_user("same"), _user("same"), _user("other")], stage="dup")
    assert [r.text for r in results] == ["Echo: same", "Echo: same", "Echo: other"]
    assert llm_server.requests == 2
    summary = client.ledger_summary("dup")
    assert summary["llm_calls"] == 2 and summary["llm_cache_hits"] == 1


def test_unknown_sampling_param_rejected(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        _client(llm_server, tmp_path).chat(_user("x"), top_k=3)


# ---- retries --------------------------------------------------------------------
def test_rate_limit_retry_after_is_honoured(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.script("rate_limit", 2, retry_after=0.5)
    client = _client(llm_server, tmp_path)
    t0 = time.perf_counter()
    res = client.chat(_user("after limits"))
    elapsed = time.perf_counter() - t0
    assert res.text == "Echo: after limits"
    assert llm_server.requests == 3
    assert elapsed >= 1.0  # two waits of Retry-After=0.5s (backoff alone would be ~0.03s)


def test_rate_limit_retry_after_one_second(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.script("rate_limit", 1, retry_after=1)
    t0 = time.perf_counter()
    assert _client(llm_server, tmp_path).chat(_user("x")).text == "Echo: x"
    assert time.perf_counter() - t0 >= 1.0


def test_server_errors_then_success(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.script("server_error", 3)
    res = _client(llm_server, tmp_path, max_retries=3).chat(_user("eventually"))
    assert res.text == "Echo: eventually"
    assert llm_server.requests == 4


def test_server_errors_exhaust_retries(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.script("server_error", 5)
    with pytest.raises(LLMUnreachable, match="HTTP 500"):
        _client(llm_server, tmp_path, max_retries=2).chat(_user("never"))
    assert llm_server.requests == 3


def test_timeout_then_unreachable(tmp_path: Path) -> None:
    with FakeLLMServer(latency_s=3.0) as server:
        url = server.base_url
        client = _client(server, tmp_path, timeout_s=0.3, max_retries=1)
        t0 = time.perf_counter()
        with pytest.raises(LLMUnreachable) as info:
            client.chat(_user("slow"))
        assert time.perf_counter() - t0 < 2.5
        assert server.requests == 2
    msg = str(info.value)
    assert url in msg and "timeout" in msg and "Fix:" in msg


def test_timeout_then_success(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.script("delay", 1, delay_s=2.0)
    res = _client(llm_server, tmp_path, timeout_s=0.3, max_retries=2).chat(_user("late"))
    assert res.text == "Echo: late"
    assert llm_server.requests == 2


def test_unreachable_port(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
    client = LLMClient(_params(url, max_retries=1), tmp_path / "c.duckdb")
    with pytest.raises(LLMUnreachable) as info:
        client.chat(_user("anyone?"))
    assert url in str(info.value) and "connection error" in str(info.value)


def test_malformed_body_retried_then_ok(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.script("malformed", 1)
    assert _client(llm_server, tmp_path).chat(_user("fine")).text == "Echo: fine"
    assert llm_server.requests == 2


def test_malformed_body_exhausted(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.script("malformed", 3)
    with pytest.raises(LLMBadResponse, match=llm_server.base_url):
        _client(llm_server, tmp_path, max_retries=2).chat(_user("broken"))


def test_non_retryable_4xx(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.script("bad_request", 1)
    with pytest.raises(LLMRequestError, match="HTTP 400"):
        _client(llm_server, tmp_path).chat(_user("bad"))
    assert llm_server.requests == 1


def test_batch_failure_keeps_finished_results_cached(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    client = _client(llm_server, tmp_path, concurrency=1, max_retries=0)
    client.chat_many([_user("a")], stage="s")
    llm_server.script("bad_request", 1)
    with pytest.raises(LLMRequestError):
        client.chat_many([_user("b"), _user("c")], stage="s")
    before = llm_server.requests
    client.chat_many([_user("a"), _user("b"), _user("c")], stage="s")
    assert llm_server.requests - before <= 2  # "a" (and whatever finished) came from the cache


# ---- cache, ledger, estimates ------------------------------------------------------
def test_cache_second_run_makes_no_http_calls(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    msgs = [_user(f"Question: who wrote Hamlet {i}") for i in range(6)]
    first = _client(llm_server, tmp_path)
    out1 = first.chat_many(msgs, stage="qa")
    assert llm_server.requests == 6
    assert first.dry_run_estimate(msgs, 50) == {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0}

    second = _client(llm_server, tmp_path)  # fresh client, same cache file
    out2 = second.chat_many(msgs, stage="qa")
    assert llm_server.requests == 6
    assert [r.text for r in out2] == [r.text for r in out1]
    assert all(r.cached for r in out2)
    s = second.ledger_summary()
    assert s["llm_cache_hits"] == 6 and s["llm_calls"] == 0
    assert s["prompt_tokens"] == 0 and s["completion_tokens"] == 0


def test_cache_key_depends_on_sampling(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    client = _client(llm_server, tmp_path)
    client.chat(_user("x"))
    client.chat(_user("x"), temperature=0.7)
    client.chat(_user("x"), max_tokens=10)
    client.chat(_user("x"), seed=1)
    client.chat(_user("x"))
    assert llm_server.requests == 4


def test_dry_run_counts_only_misses(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    client = _client(llm_server, tmp_path)
    msgs = [_user("a" * 40), _user("b" * 80)]
    client.chat(msgs[0])
    est = client.dry_run_estimate(msgs, expected_completion_tokens=30)
    assert est == {"calls": 1, "prompt_tokens": estimate_tokens(msgs[1]), "completion_tokens": 30}
    assert estimate_tokens(msgs[1]) == 80 // 4 + 4
    assert llm_server.requests == 1


def test_concurrency_bound(tmp_path: Path) -> None:
    with FakeLLMServer(latency_s=0.15) as server:
        client = _client(server, tmp_path, concurrency=3)
        client.chat_many([_user(f"p{i}") for i in range(12)], stage="c")
        assert server.requests == 12
        assert 2 <= server.max_in_flight <= 3


def test_calls_show_progress_with_their_tokens(tmp_path: Path, capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "DELAY_S", 0.0)  # as if the calls took longer than the bar's delay
    with FakeLLMServer(latency_s=0.15) as server:
        client = _client(server, tmp_path, concurrency=1)
        client.chat_many([_user(f"Question: which city hosts Louvre {i}") for i in range(4)], stage="qa")
    err = capsys.readouterr().err
    assert "llm qa" in err and "/4" in err
    prompt, completion = client.ledger_summary("qa")["prompt_tokens"], client.ledger_summary("qa")["completion_tokens"]
    assert f"{prompt} prompt + {completion} completion tokens" in err  # the totals once every call is answered


# ---- secrets ------------------------------------------------------------------------
def test_api_key_never_cached_or_logged(llm_server: FakeLLMServer, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    secret = "sk-test-NEVER-STORE-ME-0123456789"
    monkeypatch.setenv("DAGRAG_TEST_KEY", secret)
    caplog.set_level(logging.DEBUG)
    params = _params(llm_server.base_url, provider="openai", api_key_env="DAGRAG_TEST_KEY")
    client = make_client(params, tmp_path / "llm_cache.duckdb")
    assert client is not None
    llm_server.script("server_error", 1)
    client.chat_many([_user("hello"), _user("Question: is it Paris")], stage="k")
    client.chat_json([_user("List JSON entities of Rome")], ENTITY_SCHEMA, stage="k")
    assert all(h == f"Bearer {secret}" for h in llm_server.stats.auth_headers)  # key was used
    for f in tmp_path.iterdir():
        assert secret.encode() not in f.read_bytes(), f
    assert secret not in caplog.text
    assert secret not in repr(client) and secret not in repr(params)


def test_openai_provider_requires_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DAGRAG_MISSING_KEY", raising=False)
    with pytest.raises(LLMConfigError, match="DAGRAG_MISSING_KEY"):
        LLMClient(LLMParams(provider="openai", model="m", api_key_env="DAGRAG_MISSING_KEY"), None)


def test_provider_none_returns_no_client(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    assert make_client(LLMParams(provider="none"), "/nonexistent/cache.duckdb") is None
    assert "skipping LLM stages" in caplog.text


def test_bad_provider_rejected() -> None:
    with pytest.raises(ValueError, match="llm.provider"):  # the config check, from the field's metadata
        check_values(LLMParams, "llm", {"provider": "anthropic"})


# ---- structured outputs ----------------------------------------------------------------
def test_chat_json_valid(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    client = _client(llm_server, tmp_path)
    out = client.chat_json([_user("Alice met Bob in Paris"), _user("Carol")], ENTITY_SCHEMA, stage="ner")
    assert [o["entities"] for o in out] == [["Alice", "Bob", "Paris"], ["Carol"]]
    assert llm_server.stats.bodies[0]["response_format"] == {"type": "json_object"}
    assert client.ledger_summary("ner")["json_failures"] == 0


def test_chat_json_without_response_format(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    client = _client(llm_server, tmp_path, json_mode=False)
    out = client.chat_json([_user("Return JSON for Alice")], ENTITY_SCHEMA, stage="ner")
    assert out[0]["entities"] == ["Alice", "Return"]
    assert "response_format" not in llm_server.stats.bodies[0]


def test_chat_json_repair_succeeds(llm_server: FakeLLMServer, tmp_path: Path) -> None:
    llm_server.script("bad_json", 1)
    client = _client(llm_server, tmp_path)
    out = client.chat_json([_user("Dora")], ENTITY_SCHEMA, stage="ner")
    assert out[0]["entities"] == ["Dora"]
    assert llm_server.requests == 2
    repair = llm_server.stats.bodies[1]["messages"]
    assert repair[-2]["role"] == "assistant" and "missing required property 'entities'" in repair[-1]["content"]
    s = client.ledger_summary("ner")
    assert s["json_failures"] == 0 and s["json_repairs"] == 1


def test_chat_json_repair_fails_and_is_counted(tmp_path: Path) -> None:
    with FakeLLMServer(poison="POISON") as server:
        client = _client(server, tmp_path)
        msgs = [_user("Eve"), _user("POISON Frank"), _user("Gus")]
        out = client.chat_json(msgs, ENTITY_SCHEMA, stage="ner")
        assert out[0] is not None and out[1] is None and out[2] is not None
        assert server.requests == 4  # 3 + one repair
        s = client.ledger_summary("ner")
        assert s["json_failures"] == 1 and s["json_repairs"] == 1
        with pytest.raises(ExtractionMostlyEmpty, match="ner"):
            check_empty_fraction(out, 0.2, "ner")
        assert check_empty_fraction(out, 0.5, "ner") == pytest.approx(1 / 3)
