"""Tests for tasks.llm.generate."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.llm.client import LLMClient
from tasks.llm.generate import build_reader_messages, extract_answer, select_passages
from tasks.llm.params import LLMParams
from tests.llm_server import FakeLLMServer


def test_reader_prompt_numbers_passages_in_rank_order() -> None:
    msgs = build_reader_messages("Who founded X?", ["first passage", "second passage"], 1000)
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    assert user.index("[1] first passage") < user.index("[2] second passage")
    assert "Question: Who founded X?" in user and "Answer:" in user
    assert "step by step" in user


def test_reader_prompt_respects_budget() -> None:
    passages = ["a" * 400, "b" * 400, "c" * 40]  # 100, 100, 10 tokens
    assert select_passages(passages, 205) == passages[:2]
    assert select_passages(passages, 210) == passages
    assert select_passages(passages, 150) == passages[:1]  # stops at first that does not fit
    assert select_passages(["z" * 1000], 10) == ["z" * 40]  # top passage truncated, never empty
    user = build_reader_messages("q", passages, 150)[1]["content"]
    assert "[2]" not in user


@pytest.mark.parametrize("text, expected", [
    ("Reasoning...\nAnswer: Paris", "Paris"),
    ("answer: paris.", "paris"),
    ("Step 1 answer: no\nSo...\nFinal Answer: \"Barack Obama\".", "Barack Obama"),
    ("**Answer:** Mount Everest", "Mount Everest"),
    ("**Answer**: 1969", "1969"),
    ("Thought: blah\nANSWER:\n  'Yes'  \n", "Yes"),
    ("I think\nit is Rome.\n\n", "it is Rome"),
    ("", ""),
    (None, ""),
])
def test_extract_answer(text: str | None, expected: str) -> None:
    assert extract_answer(text) == expected


def test_reader_end_to_end_with_server(tmp_path: Path) -> None:
    with FakeLLMServer() as server:
        client = LLMClient(LLMParams(provider="local", model="r", base_url=server.base_url),
                           tmp_path / "c.duckdb")
        msgs = build_reader_messages("Where is Lyon", ["Lyon is in France."], 100)
        assert extract_answer(client.chat(msgs, stage="reader").text) == "Lyon"
