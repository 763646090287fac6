"""Tests for tasks.methods.archrag.filtering: packing, the point merge, the JSON repair / failure count,
the cache, the Direct Prompt mode and the dry-run estimate (against the fake OpenAI-compatible server)."""

from __future__ import annotations

import json
import re
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tasks.llm.client import LLMClient
from tasks.llm.ledger import estimate_text_tokens
from tasks.llm.params import LLMParams
from tasks.methods.archrag.filtering import (
    DIRECT_STAGE,
    FILTER_STAGE,
    FILTER_SYSTEM,
    MERGE_STAGE,
    MERGE_SYSTEM,
    NO_POINTS,
    FilterParams,
    adaptive_answer,
    direct_answer,
    filter_estimate,
    generate_answers,
    pack_items,
    plan_filter_calls,
    reply_points,
    select_points,
)
from tests.llm_server import FakeLLMServer

ITEM = re.compile(r"^\[\d+\] (.*)$", re.MULTILINE)
POINT = re.compile(r"^Point (\d+) \(importance ([0-9.]+)\):\n(.*)$", re.MULTILINE)
SCORES = {"GOOD": 90, "MEH": 40, "BAD": 0, "NEG": -5, "BIG": 150}


def _score(item: str) -> float:
    """Scripted importance of an item: by its marker word, 10 when it has none."""
    return next((s for m, s in SCORES.items() if m in item), 10)


def _user(body: dict[str, Any], which: int) -> str:
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    return users[which]


def _is_filter(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == FILTER_SYSTEM


def _is_merge(body: dict[str, Any]) -> bool:
    return body["messages"][0]["content"] == MERGE_SYSTEM


def responder(body: dict[str, Any]) -> str:
    """Filter: one point per record ('pt:<record>', scripted score); POISON -> never valid JSON; FLAKY ->
    invalid until repaired. Merge: answers with the top point's record. Direct: with its first passage."""
    if _is_filter(body):
        task = _user(body, 0)
        repaired = any(m["role"] == "assistant" for m in body["messages"])
        if "POISON" in task or ("FLAKY" in task and not repaired):
            return "Sorry, here are some thoughts but no JSON."
        return json.dumps({"points": [{"description": f"pt:{t}", "score": _score(t)} for t in ITEM.findall(task)]})
    user = _user(body, -1)
    if _is_merge(body):
        points = POINT.findall(user)
        return f"Read {len(points)} points.\nAnswer: {points[0][2] if points else 'nothing'}"
    first = ITEM.findall(user)
    return f"Looked at the passages.\nAnswer: {first[0] if first else 'nothing'}"


def _client(server: FakeLLMServer, tmp_path: Path, **kw: Any) -> LLMClient:
    params = LLMParams(provider="local", model="test-model", base_url=server.base_url, timeout_s=5.0,
                       max_retries=2, backoff_base_s=0.01, concurrency=4, **kw)
    return LLMClient(params, tmp_path / "llm_cache.duckdb")


def _bodies(server: FakeLLMServer, pick) -> list[dict[str, Any]]:
    with server.stats.lock:
        return [b for b in server.stats.bodies if pick(b)]


# ----------------------------------------------------------------------------- packing (eq. 3)

def test_pack_items_budget_order_and_truncation() -> None:
    a, b, c, d, e = "a" * 16, "b" * 16, "c" * 16, "d" * 60, "e" * 4   # 4, 4, 4, 15, 1 tokens
    packs, truncated = pack_items([a, b, c, d, "  ", e], 10)
    assert packs == [[a, b], [c], ["d" * 40], [e]]   # d cut to the 10-token budget; blank skipped
    assert truncated == 1
    assert pack_items([a, b, c], 12) == ([[a, b, c]], 0)   # exactly the budget fits
    assert pack_items([], 10) == ([], 0)
    items = [f"item {i}:" + "x" * (7 * i % 50) for i in range(30)]
    packs, truncated = pack_items(items, 20)
    assert truncated == 0 and [t for p in packs for t in p] == items   # item order kept
    assert all(sum(estimate_text_tokens(t) for t in p) <= 20 for p in packs)
    # greedy: the next pack's first item would not have fitted in the previous pack
    assert all(sum(map(estimate_text_tokens, p)) + estimate_text_tokens(q[0]) > 20 for p, q in pairwise(packs))


def test_filter_plan_is_per_layer() -> None:
    layers = [[["e1 " * 5, "e2 " * 5, "r1 " * 5], ["c1 " * 5]], [[], ["c2"]]]
    plan = plan_filter_calls(["q0", "q1"], layers, 8)   # each "xx " * 5 item is 4 tokens
    assert plan.owner == [0, 0, 0, 1]   # q0: layer 0 in two packs, layer 1 in one; q1: layer 1 only
    users = [m[1]["content"] for m in plan.messages]
    assert ["e1" in users[0], "e2" in users[0], "r1" in users[1]] == [True, True, True]
    assert "entities and relations" in users[0] and "community reports (hierarchy level 1)" in users[2]
    assert "Question: q1" in users[3] and "[1] c2" in users[3]
    with pytest.raises(ValueError):
        plan_filter_calls(["q0"], layers, 8)


def test_reply_points_clip_scores() -> None:
    reply = {"points": [{"description": " a ", "score": 150}, {"description": "b", "score": -3},
                        {"description": "c", "score": 55.5}]}
    assert reply_points(reply) == [("a", 100.0), ("b", 0.0), ("c", 55.5)]
    assert reply_points(None) == []


# ----------------------------------------------------------------------------- merge (eq. 4)

def test_select_points_sorts_drops_and_cuts() -> None:
    points = [("low", 5.0), ("zero", 0.0), ("top", 80.0), ("tie-first", 50.0), ("", 70.0), ("tie-second", 50.0)]
    sel = select_points(points, 1000)
    assert [b.splitlines()[1] for b in sel.blocks] == ["top", "tie-first", "tie-second", "low"]   # stable ties
    assert sel.blocks[0] == "Point 1 (importance 80):\ntop"
    assert (sel.dropped, sel.cut) == (2, 0)   # score 0 and the empty description
    one = estimate_text_tokens(sel.blocks[0])
    sel2 = select_points(points, one + estimate_text_tokens(sel.blocks[1]))
    assert len(sel2.blocks) == 2 and (sel2.dropped, sel2.cut) == (2, 2)
    assert select_points([("x" * 400, 9.0)], 10).blocks == [("Point 1 (importance 9):\n" + "x" * 400)[:40]]


def test_adaptive_answer_end_to_end(tmp_path: Path) -> None:
    questions = ["Who is first?", "Who else?"]
    layers = [[["ent MEH one", "rel BAD link", "ent plain"], ["comm GOOD report", "comm NEG report"]],
              [["ent BAD only"], ["comm BIG report"]]]
    with FakeLLMServer(responder=responder) as server:
        client = _client(server, tmp_path)
        calls: list[str] = []
        chat_many = client.chat_many

        def counted(msgs, stage, **kw):
            calls.append(stage)
            return chat_many(msgs, stage, **kw)
        client.chat_many = counted  # type: ignore[method-assign]
        gen = adaptive_answer(client, questions, layers, FilterParams())
        assert calls == [FILTER_STAGE, MERGE_STAGE]   # all questions' filters in one batch, then the merges
        merges = {_user(b, -1).split("Question: ")[1].split("\n")[0]: _user(b, -1)
                  for b in _bodies(server, _is_merge)}
    assert gen.stats["filter_calls"] == 4 and gen.stats["merge_calls"] == 2
    assert gen.stats["filter_failures"] == 0 and gen.stats["filter_repairs"] == 0
    assert gen.stats["points_total"] == 7 and gen.stats["points_dropped"] == 3   # 2 BAD + NEG clipped to 0
    assert gen.stats["points_kept"] == 4 and gen.stats["points_cut"] == 0
    assert gen.stats["questions_without_points"] == 0
    got = [(float(s), d) for _, s, d in POINT.findall(merges["Who is first?"])]
    assert got == [(90.0, "pt:comm GOOD report"), (40.0, "pt:ent MEH one"), (10.0, "pt:ent plain")]
    assert POINT.findall(merges["Who else?"]) == [("1", "100", "pt:comm BIG report")]
    assert gen.answers == ["pt:comm GOOD report", "pt:comm BIG report"]
    assert gen.raw[0].endswith("Answer: pt:comm GOOD report")
    assert client.ledger_summary(FILTER_STAGE)["llm_calls"] == 4
    assert client.ledger_summary(MERGE_STAGE)["llm_calls"] == 2


def test_merge_budget_and_no_points(tmp_path: Path) -> None:
    items = [f"GOOD fact number {i}" for i in range(6)]
    with FakeLLMServer(responder=responder) as server:
        client = _client(server, tmp_path)
        block = "Point 1 (importance 90):\npt:GOOD fact number 0"
        budget = 2 * estimate_text_tokens(block) + 1
        gen = adaptive_answer(client, ["q many", "q none"], [[items], [["BAD a", "NEG b"]]],
                              FilterParams(merge_budget_tokens=budget))
        merges = {_user(b, -1).split("Question: ")[1].split("\n")[0]: _user(b, -1)
                  for b in _bodies(server, _is_merge)}
    kept = POINT.findall(merges["q many"])
    assert [d for _, _, d in kept] == ["pt:GOOD fact number 0", "pt:GOOD fact number 1"]   # ties keep item order
    assert sum(estimate_text_tokens(f"Point {k} (importance {s}):\n{d}") for k, s, d in kept) <= budget
    assert gen.stats["points_cut"] == 4 and gen.stats["points_dropped"] == 2
    assert NO_POINTS in merges["q none"] and gen.stats["questions_without_points"] == 1
    assert gen.answers == ["pt:GOOD fact number 0", "nothing"]


# ----------------------------------------------------------------------------- failures, repair, cache

def test_invalid_reply_one_repair_then_failure(tmp_path: Path) -> None:
    with FakeLLMServer(responder=responder) as server:
        client = _client(server, tmp_path)
        gen = adaptive_answer(client, ["q"], [[["POISON item GOOD"]]], FilterParams())
        filters = _bodies(server, _is_filter)
        assert server.requests == 3   # filter + its one repair + merge
    assert len(filters) == 2 and sum(any(m["role"] == "assistant" for m in b["messages"]) for b in filters) == 1
    assert gen.stats["filter_failures"] == 1 and gen.stats["filter_repairs"] == 1
    assert gen.stats["points_total"] == 0 and gen.answers == ["nothing"]
    summary = client.ledger_summary(FILTER_STAGE)
    assert summary["json_failures"] == 1 and summary["json_repairs"] == 1


def test_repaired_reply_is_used(tmp_path: Path) -> None:
    with FakeLLMServer(responder=responder) as server:
        client = _client(server, tmp_path)
        gen = adaptive_answer(client, ["q"], [[["FLAKY GOOD item"]]], FilterParams())
        assert server.requests == 3
    assert gen.stats["filter_failures"] == 0 and gen.stats["filter_repairs"] == 1
    assert gen.answers == ["pt:FLAKY GOOD item"]


def test_rerun_hits_the_cache(tmp_path: Path) -> None:
    questions = ["a?", "b?"]
    layers = [[["GOOD x", "MEH y"], ["c1"]], [["BIG z"]]]
    with FakeLLMServer(responder=responder) as server:
        first = adaptive_answer(_client(server, tmp_path), questions, layers, FilterParams(filter_budget_tokens=3))
        n = server.requests
        assert n == first.stats["filter_calls"] + 2 and first.stats["filter_calls"] == 4
        again = _client(server, tmp_path)   # a fresh client on the same cache file
        second = adaptive_answer(again, questions, layers, FilterParams(filter_budget_tokens=3))
        assert server.requests == n   # 0 new HTTP requests
    assert (second.raw, second.answers) == (first.raw, first.answers)
    assert again.ledger_summary()["llm_calls"] == 0 and again.ledger_summary()["llm_cache_hits"] == 6


def test_filter_estimate_matches_the_calls(tmp_path: Path) -> None:
    questions = ["a?", "b?", "c?"]
    layers = [[["GOOD x", "MEH y"], ["c1"]], [["BAD only"]], [["BIG z"], []]]
    params = FilterParams()
    with FakeLLMServer(responder=responder) as server:
        client = _client(server, tmp_path)
        before = filter_estimate(client, questions, layers, params)
        assert server.requests == 0
        assert before[f"{FILTER_STAGE}_calls"] == 4 and before[f"{MERGE_STAGE}_calls"] == 3
        assert before["calls"] == 7 and before["completion_tokens"] == 4 * 1000 + 3 * 512
        gen = adaptive_answer(client, questions, layers, params)
        after = filter_estimate(client, questions, layers, params)
    assert gen.stats["questions_without_points"] == 1
    # filter prompts are all cached now; only "b?" had no points, so its real merge prompt was the estimated one
    assert after[f"{FILTER_STAGE}_calls"] == 0 and after[f"{MERGE_STAGE}_calls"] == 2


# ----------------------------------------------------------------------------- Direct Prompt

def test_direct_mode_one_call_per_question(tmp_path: Path) -> None:
    questions = ["q1", "q2", "q3"]
    layers = [[["ent A", "rel B"], ["comm C"]], [[], ["comm D"]], [["ent E"]]]
    params = FilterParams(mode="direct")
    with FakeLLMServer(responder=responder) as server:
        client = _client(server, tmp_path)
        est = filter_estimate(client, questions, layers, params)
        gen = generate_answers(client, questions, layers, params)
        assert server.requests == 3 and not _bodies(server, _is_filter)
        bodies = _bodies(server, lambda b: True)
    assert est["calls"] == 3 and est[f"{DIRECT_STAGE}_calls"] == 3
    assert all(b.get("response_format") is None for b in bodies)
    q1 = next(_user(b, -1) for b in bodies if "Question: q1" in _user(b, -1))
    assert ITEM.findall(q1) == ["ent A", "rel B", "comm C"]   # layer 0 first, rank order kept
    assert gen.answers == ["ent A", "comm D", "ent E"]
    assert gen.stats == {"direct_calls": 3, "items_used": 5, "items_cut": 0}
    assert client.ledger_summary(DIRECT_STAGE)["llm_calls"] == 3
    assert direct_answer(client, questions, layers, params).raw == gen.raw   # cached


def test_direct_budget_cuts_items(tmp_path: Path) -> None:
    items = ["x" * 40, "y" * 40, "z" * 40]   # 10 tokens each
    with FakeLLMServer(responder=responder) as server:
        gen = direct_answer(_client(server, tmp_path), ["q"], [[items[:2], items[2:]]],
                            FilterParams(mode="direct", merge_budget_tokens=25))
        user = _user(_bodies(server, lambda b: True)[0], -1)
    assert ITEM.findall(user) == items[:2] and gen.stats["items_cut"] == 1


def test_params_validation() -> None:
    with pytest.raises(ValueError):
        FilterParams(mode="other")
    with pytest.raises(ValueError):
        FilterParams(filter_budget_tokens=0)
