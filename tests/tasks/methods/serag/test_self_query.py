"""Self-query (§3.3, App. A.1): the LLM's passage is appended to the question, cached, in the ledger."""
from __future__ import annotations

from pathlib import Path

from tasks.llm.client import LLMClient
from tasks.llm.params import LLMParams
from tasks.methods.serag.retriever import SELF_QUERY_STAGE, SelfQuery, self_query_client
from tasks.methods.serag.params import SeRAGParams
from tests.llm_server import FakeLLMServer


def _params(base_url: str) -> LLMParams:
    return LLMParams(provider="local", model="test-model", base_url=base_url, timeout_s=5.0, max_retries=1,
                     backoff_base_s=0.01, backoff_max_s=1.0, concurrency=2)


def test_pseudo_document_is_appended_and_cached(llm_server: FakeLLMServer, tmp_path: Path) -> None:  # noqa: F811
    sq = SelfQuery(LLMClient(_params(llm_server.base_url), tmp_path / "llm_cache.duckdb"), max_tokens=64)
    out = sq(["Who directed Following?", "Where is Walibi Holland?"])
    assert out[0].startswith("Who directed Following?\nEcho: Query: Who directed Following?")
    assert out[1].startswith("Where is Walibi Holland?\n")
    served = llm_server.requests
    assert sq(["Who directed Following?"])[0] == out[0] and llm_server.requests == served  # from the cache
    ledger = sq.client.ledger_summary(SELF_QUERY_STAGE)
    assert ledger["llm_calls"] == 2


def test_without_llm_questions_pass_through(tmp_path: Path) -> None:
    assert self_query_client(SeRAGParams(), LLMParams(provider="none"), str(tmp_path)) is None
    assert self_query_client(SeRAGParams(self_query=False), _params("http://127.0.0.1:1"), str(tmp_path)) is None
    sq = SelfQuery(None, 64)
    assert not sq.enabled and sq(["a question"]) == ["a question"]
