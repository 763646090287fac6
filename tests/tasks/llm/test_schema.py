"""Tests for tasks.llm.schema: JSON parsing and validation, the repair round, empty-output checks."""

from __future__ import annotations

import json
from typing import Sequence

import pytest

from tasks.llm.params import ExtractionMostlyEmpty, Messages
from tasks.llm.schema import (
    check_empty_fraction,
    parse_json_text,
    structured_replies,
    validate_schema,
)

SCHEMA = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}


def test_structured_replies_repairs_once() -> None:
    rounds: list[list[Messages]] = []
    script = iter([['{"n": 1}', "no json", '{"n": "x"}', '{"n": 4}'],  # first round
                   ['```json\n{"n": 2}\n```', "still nothing"]])          # one repair round

    def ask(conversations: Sequence[Messages]) -> list[str]:
        rounds.append(list(conversations))
        return next(script)

    msgs = [[{"role": "user", "content": f"q{i}"}] for i in range(4)]
    out = structured_replies(ask, msgs, SCHEMA)
    assert out.values == [{"n": 1}, {"n": 2}, None, {"n": 4}]
    assert (out.repairs, out.failures) == (2, 1)
    repair = rounds[1][1]
    assert repair[:2] == [msgs[2][0], {"role": "assistant", "content": '{"n": "x"}'}]
    note = repair[2]["content"]
    assert "$.n: expected integer" in note and json.dumps(SCHEMA, sort_keys=True) in note
    assert len(rounds) == 2


def test_structured_replies_skips_the_repair_round_when_all_valid() -> None:
    calls = []
    out = structured_replies(lambda c: calls.append(c) or ['{"n": 0}'] * len(c),
                             [[{"role": "user", "content": "a"}]], SCHEMA)
    assert out.values == [{"n": 0}] and (out.repairs, out.failures) == (0, 0) and len(calls) == 1


def test_check_empty_fraction() -> None:
    outs = [{"triples": []}, None, {}, {"triples": [["a", "b", "c"]]}]
    with pytest.raises(ExtractionMostlyEmpty):
        check_empty_fraction(outs, 0.5, "openie")
    assert check_empty_fraction(outs, 0.75, "openie") == 0.75
    assert check_empty_fraction([], 0.0, "openie") == 0.0


def test_parse_json_text_and_validation() -> None:
    assert parse_json_text('```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json_text('Sure! {"a": [1, 2]} done') == {"a": [1, 2]}
    with pytest.raises(ValueError):
        parse_json_text("no json here")
    schema = {"type": "object", "required": ["n", "xs"],
              "properties": {"n": {"type": "integer"}, "flag": {"type": "boolean"},
                             "xs": {"type": "array", "items": {"type": "number"}}}}
    assert validate_schema({"n": 1, "xs": [1.5, 2]}, schema) is None
    assert "missing required" in validate_schema({"n": 1}, schema)  # type: ignore[operator]
    assert "$.n" in validate_schema({"n": True, "xs": []}, schema)  # type: ignore[operator]
    assert "$.xs[1]" in validate_schema({"n": 1, "xs": [1, "2"]}, schema)  # type: ignore[operator]
    assert "$.flag" in validate_schema({"n": 1, "xs": [], "flag": 1}, schema)  # type: ignore[operator]
