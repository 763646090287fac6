"""Tests for tasks.llm.ledger: token estimates and per-stage totals."""

from __future__ import annotations

from tasks.llm.ledger import Ledger, estimate_text_tokens, estimate_tokens
from tasks.llm.params import LLMResult


def test_estimates() -> None:
    assert estimate_text_tokens("") == 0 and estimate_text_tokens("abcde") == 2
    msgs = [{"role": "user", "content": "a" * 8}, {"role": "user", "content": [{"type": "text", "text": "bcd"}]}]
    assert estimate_tokens(msgs) == (2 + 4) + (1 + 4)


def test_ledger_counts_hits_repeats_and_json_rounds() -> None:
    ledger = Ledger()
    results = {"a": LLMResult("x", 10, 2, False, 0.5), "b": LLMResult("y", 0, 0, True, 0.0)}
    ledger.record("s", ["a", "a", "b", "missing"], results, {"b"}, wall=1.25)
    ledger.record("t", ["a"], results, set(), wall=0.5)
    ledger.count_json("s", repairs=2, failures=1)
    s = ledger.summary("s")
    assert s == {"prompt_tokens": 10, "completion_tokens": 2, "llm_calls": 1, "llm_cache_hits": 2,
                 "llm_failed": 0, "seconds": 0.5, "wall_seconds": 1.25, "json_failures": 1, "json_repairs": 2}
    total = ledger.summary()
    assert total["llm_calls"] == 2 and total["prompt_tokens"] == 20 and total["wall_seconds"] == 1.75
    assert [e.stage for e in ledger.entries()] == ["s", "s", "s", "t"] and len(ledger.entries("t")) == 1
