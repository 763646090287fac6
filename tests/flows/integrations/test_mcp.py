"""``dagrag mcp`` as an agent host runs it, driven by the official MCP SDK's own client over both transports:
stdio (the host starts the process) and streamable HTTP (loopback, the API key enforced). The retrieve tool
answers as ``open_index().retrieve``; the answer tool is there exactly when an LLM is configured."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from flows.serving import open_index
from tests.flows.serving_helpers import REPO, ServeProcess, build_bm25, sample_questions

mcp = pytest.importorskip("mcp", reason="pip install -e '.[mcp]'")

KEY = "mcp-key-0123456789"
K = 4


@pytest.fixture(scope="module")
def bm25(tmp_path_factory) -> list[str]:
    return build_bm25(tmp_path_factory.mktemp("mcp"))


async def exercise(client, overrides: list[str], questions: list[str]) -> float:
    """List, call and read through ``client``; the retrieve tool's median round trip in ms."""
    index = open_index(*overrides)
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"retrieve"}  # no LLM configured: no answer tool
    assert set(tools["retrieve"].input_schema["properties"]) == {"question", "k"}
    seconds = []
    for q, ranked in zip(questions, index.retrieve(questions, k=K)):
        started = time.perf_counter()
        result = await client.call_tool("retrieve", {"question": q, "k": K})
        seconds.append(time.perf_counter() - started)
        assert not result.is_error
        got = result.structured_content
        assert got["question"] == q and got["trace"] == ranked.trace
        assert [{k: v for k, v in p.items() if k != "citation"} for p in got["passages"]] == \
               [{"lineage": None, **p.to_dict()} for p in ranked]
        assert [p["citation"] for p in got["passages"]] == [p.citation for p in ranked]  # the one rule
    refused = await client.call_tool("retrieve", {"question": "  "})
    assert refused.is_error and "question is empty" in refused.content[0].text
    refused = await client.call_tool("retrieve", {"question": questions[0], "k": 0})
    assert refused.is_error and "serve.max_k" in refused.content[0].text
    resources = (await client.list_resources()).resources
    assert [str(r.uri) for r in resources] == ["dagrag://index"]
    described = json.loads((await client.read_resource("dagrag://index")).contents[0].text)
    assert described["fingerprint"] == index.info.fingerprint and described["method"] == "bm25"
    return sorted(seconds)[len(seconds) // 2] * 1000


def test_mcp_over_stdio_with_the_sdk_client(bm25):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "flows.cli", "mcp", *bm25], cwd=str(REPO),
                                   env={k: v for k, v in os.environ.items() if k != "DAGRAG_API_KEY"})

    async def run() -> float:
        async with Client(params, read_timeout_seconds=120) as client:
            return await exercise(client, bm25, sample_questions(bm25))

    print(f"MCP stdio retrieve round trip: {asyncio.run(run()):.2f} ms (median)")


def test_mcp_over_streamable_http_with_the_key(bm25):
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    with ServeProcess([*bm25, "serve.mcp_transport=http"], env={"DAGRAG_API_KEY": KEY}, command="mcp") as server:
        url = f"{server.url}/mcp"

        async def run() -> float:
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {KEY}"})
            async with http, Client(streamable_http_client(url, http_client=http)) as client:
                return await exercise(client, bm25, sample_questions(bm25))

        print(f"MCP streamable-HTTP retrieve round trip: {asyncio.run(run()):.2f} ms (median)")
        import httpx

        refused = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert refused.status_code == 401 and "API key" in refused.json()["error"]


def test_mcp_http_beyond_loopback_needs_a_key(bm25):
    run = subprocess.run([sys.executable, "-m", "flows.cli", "mcp", *bm25, "serve.mcp_transport=http",
                          "serve.host=0.0.0.0"], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={k: v for k, v in os.environ.items() if k != "DAGRAG_API_KEY"})
    assert run.returncode == 2 and "DAGRAG_API_KEY" in run.stderr


def test_the_answer_tool_with_an_llm(bm25):
    """In process over the SDK's in-memory transport (the same server object ``dagrag mcp`` runs)."""
    from mcp import Client

    from flows.integrations.mcp_server import build_server
    from tests.llm_server import FakeLLMServer

    questions = sample_questions(bm25)[:2]
    with FakeLLMServer() as llm:
        index = open_index(*bm25, "llm=local", f"llm.base_url={llm.base_url}")

        async def run() -> None:
            async with Client(build_server(index, max_k=50, max_question_chars=2000)) as client:
                assert {t.name for t in (await client.list_tools()).tools} == {"retrieve", "answer"}
                for q, want in zip(questions, index.answer(questions, k=K)):
                    got = (await client.call_tool("answer", {"question": q, "k": K})).structured_content
                    assert got["answer"] == want.answer
                    assert [p["doc_id"] for p in got["passages"]] == [p.doc_id for p in want.passages]

        asyncio.run(run())


def test_concurrent_retrieve_calls_are_answered_from_one_batcher(bm25):
    """Tool calls that arrive together (one client, many requests in flight) each get their own question's passages
    at their own k, through the micro-batcher the server shares between calls."""
    from mcp import Client

    from flows.integrations.mcp_server import build_server

    index = open_index(*bm25)
    questions = sample_questions(bm25)
    ks = [1 + i % 5 for i in range(len(questions))]

    async def run() -> list[dict]:
        async with Client(build_server(index, max_k=50, max_question_chars=2000)) as client:
            replies = await asyncio.gather(*(client.call_tool("retrieve", {"question": q, "k": k})
                                             for q, k in zip(questions, ks)))
            return [r.structured_content for r in replies]

    for got, q, k in zip(asyncio.run(run()), questions, ks):
        assert [p["doc_id"] for p in got["passages"]] == [p.doc_id for p in index.retrieve(q, k=k)[0]]
