"""Tests for tasks.eval.answer_metrics (hand-computed examples)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.eval.answer_metrics import (
    aggregate,
    contain_acc,
    exact_match,
    f1,
    llm_judge,
    normalize_answer,
)
from tasks.llm.client import LLMClient
from tasks.llm.params import LLMParams
from tests.llm_server import FakeLLMServer


def test_normalize() -> None:
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("theater") == "theater"  # articles only as whole words
    assert normalize_answer(None) == ""


def test_exact_match_aliases() -> None:
    assert exact_match("the Big Apple.", ["New York City", "Big Apple"])
    assert not exact_match("New York", ["New York City"])
    assert not exact_match("anything", [])


def test_f1_hand_computed() -> None:
    # pred tokens {new, york}, gold {new, york, city}: P=1, R=2/3 -> F1=0.8
    assert f1("New York", ["New York City"]) == pytest.approx(0.8)
    # max over aliases
    assert f1("New York", ["Paris", "New York City", "NYC"]) == pytest.approx(0.8)
    # articles and punctuation ignored: "a red car." vs "the red car" -> exact
    assert f1("a red car.", ["the red car"]) == pytest.approx(1.0)
    # repeated tokens: overlap = min(2,1) for b + min(1,2) for c = 2; P = R = 2/3
    assert f1("b b c", ["b c c"]) == pytest.approx(2 / 3)
    assert f1("", ["x"]) == 0.0


def test_f1_yes_no_special_case() -> None:
    assert f1("yes", ["yes"]) == 1.0
    assert f1("no", ["yes"]) == 0.0
    assert f1("yes it is", ["yes"]) == 0.0  # differs from a yes/no gold -> 0
    assert f1("noanswer", ["no answer here"]) == 0.0


def test_contain_acc() -> None:
    assert contain_acc("It was the Eiffel Tower, in Paris.", ["eiffel tower"])
    assert not contain_acc("Paris", ["Eiffel Tower"])
    assert not contain_acc("something", ["", "the"])  # empty normalised aliases never match


def test_aggregate_percent() -> None:
    preds = ["Paris", "New York", "no"]
    golds = [["paris"], ["New York City"], ["yes"]]
    m = aggregate(preds, golds)
    assert m["em"] == pytest.approx(100 / 3)
    assert m["f1"] == pytest.approx(100 * (1 + 0.8 + 0) / 3)
    assert m["contain_acc"] == pytest.approx(100 / 3)
    assert aggregate([], []) == {"em": 0.0, "f1": 0.0, "contain_acc": 0.0}
    with pytest.raises(ValueError):
        aggregate(["a"], [])


def test_llm_judge(tmp_path: Path) -> None:
    with FakeLLMServer() as server:
        client = LLMClient(LLMParams(provider="local", model="judge", base_url=server.base_url,
                                     backoff_base_s=0.01), tmp_path / "c.duckdb")
        verdicts = llm_judge(client, ["Q1", "Q2"], ["a", "b"], [["a"], ["c"]])
        assert verdicts == [True, True]  # the fake server always says correct
        assert server.requests == 2
        assert client.ledger_summary("llm_judge")["llm_calls"] == 2
