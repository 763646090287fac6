"""Tests for tasks.eval.answer_metrics (hand-computed examples)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tasks.eval.answer_metrics import (
    aggregate,
    contain_acc,
    exact_match,
    f1,
    llm_judge,
    normalize_answer,
    paper_accuracy,
    paper_metrics,
    score_predictions,
    token_recall,
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


def test_score_predictions_matches_answers_by_qid(tmp_path: Path) -> None:
    """Predictions in another order than the questions are scored against their own question's answers."""
    questions = pd.DataFrame({"qid": ["q1", "q2"], "question": ["Q1", "Q2"],
                              "answers": [["Paris"], ["Blue", "azure"]]})
    predictions = pd.DataFrame({"qid": ["q2", "q1"], "prediction": ["azure", "Lyon"],
                                "raw": ["It is azure.\nAnswer: azure", "Answer: Lyon"]})
    scores = score_predictions(predictions, questions)
    assert scores == {**aggregate(["azure", "Lyon"], [["Blue", "azure"], ["Paris"]]),
                      **paper_metrics(["It is azure.\nAnswer: azure", "Answer: Lyon"], [["Blue", "azure"], ["Paris"]])}
    assert scores["em"] == 50.0 and "llm_acc" not in scores
    with FakeLLMServer() as server:
        judge = LLMClient(LLMParams(provider="local", model="judge", base_url=server.base_url,
                                    backoff_base_s=0.01), tmp_path / "c.duckdb")
        assert score_predictions(predictions, questions, judge)["llm_acc"] == 100.0  # the fake judge says yes
        assert server.requests == 2


# ---- ArchRAG paper metrics (on raw generations) --------------------------------
RAW = "The tower was designed by Gustave Eiffel's firm.\nAnswer: Eiffel Tower"


def test_paper_accuracy_substring_of_raw_output() -> None:
    assert paper_accuracy(RAW, ["The Eiffel Tower"])           # articles/punctuation normalised away
    assert paper_accuracy(RAW, ["London", "gustave eiffels"])  # any alias; "Eiffel's" -> "eiffels"
    assert not paper_accuracy(RAW, ["Gustave Eiffel Tower"])   # the whole gold must appear contiguously
    assert not paper_accuracy(RAW, ["", "a"])                  # empty normalised aliases never match
    assert paper_accuracy("I do not know", ["no"])             # plain substring (as the authors' code): "not" holds "no"


def test_token_recall_hand_computed() -> None:
    # gold {new, york, city}: 2 of 3 gold tokens in the prediction
    assert token_recall("New York is big", ["New York City"]) == pytest.approx(2 / 3)
    # recall ignores extra prediction tokens: all 3 gold tokens present -> 1
    assert token_recall("it is the city of New York", ["New York City"]) == pytest.approx(1.0)
    # max over aliases: "Big Apple" -> 1/2, "New York City" -> 1/3
    assert token_recall("apple pie in york", ["New York City", "Big Apple"]) == pytest.approx(0.5)
    # multiset overlap: pred {b:2, c:1}, gold {b:1, c:2} -> common 2 of 3 gold tokens
    assert token_recall("b b c", ["b c c"]) == pytest.approx(2 / 3)
    assert token_recall("", ["x"]) == 0.0 and token_recall("x", [""]) == 0.0 and token_recall("x", []) == 0.0


def test_token_recall_yes_no_rule() -> None:
    assert token_recall("Yes.", ["yes"]) == 1.0
    assert token_recall("no", ["yes"]) == 0.0
    assert token_recall("yes, they are", ["yes"]) == 0.0     # a yes/no gold needs exactly yes/no
    assert token_recall("no", ["no answer"]) == 0.0          # a yes/no prediction vs another gold
    assert token_recall("no answer given", ["no answer"]) == 1.0   # neither side IS yes/no/noanswer


def test_paper_metrics_percent() -> None:
    raws = [RAW, "It is in New York.\nAnswer: New York", "yes"]
    golds = [["Eiffel Tower"], ["New York City"], ["no"]]
    # accuracy: hit, miss, miss; recall: 1, 2/3, 0
    m = paper_metrics(raws, golds)
    assert m["accuracy"] == pytest.approx(100 / 3)
    assert m["recall"] == pytest.approx(100 * (1 + 2 / 3 + 0) / 3)
    assert paper_metrics([], []) == {"accuracy": 0.0, "recall": 0.0}
    with pytest.raises(ValueError):
        paper_metrics(["a"], [])
