"""``flows.serving.remote``: a served index answers as the opened one does (same Passage, Ranked and Answer
objects), a 503 is retried after its Retry-After, and refusals raise what ``open_index`` raises."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from flows.commands.ui_screenshot import free_port
from flows.runtime.config import ServeParams
from flows.runtime.preflight import NoLLM
from flows.serving import open_index, remote
from flows.serving.app import Service
from flows.serving.remote import RemoteError
from tests.flows.serving_helpers import build_bm25, sample_questions, uvicorn_thread

KEY = "remote-key-0123456789"


@pytest.fixture(scope="module")
def bm25(tmp_path_factory) -> list[str]:
    return build_bm25(tmp_path_factory.mktemp("remote"))


def same(a, b) -> None:
    """Two lists of Ranked are identical: questions, passages (every field) and traces."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.question == y.question and list(x) == list(y) and x.trace == y.trace


def test_remote_answers_as_open_index(bm25):
    from tests.llm_server import FakeLLMServer

    questions = sample_questions(bm25)
    with FakeLLMServer() as llm:
        index = open_index(*bm25, "llm=local", f"llm.base_url={llm.base_url}")
        with uvicorn_thread(Service(index, ServeParams(), api_key=KEY)) as url, remote(url, api_key=KEY) as client:
            same(client.retrieve(questions, k=5), index.retrieve(questions, k=5))
            same(client.retrieve(questions[0]), index.retrieve(questions[0]))  # one string, the method's top_k
            same(asyncio.run(client.aretrieve(questions, k=3)), index.retrieve(questions, k=3))
            assert client.retrieve([]) == []
            assert client.info.fingerprint == index.info.fingerprint and client.info.method == "bm25"
            got, want = client.answer(questions[:3], k=4), index.answer(questions[:3], k=4)
            assert [(a.question, a.answer, a.raw, a.context) for a in got] == \
                   [(a.question, a.answer, a.raw, a.context) for a in want]
            same([a.passages for a in got], [a.passages for a in want])
            with pytest.raises(ValueError, match="empty"):
                client.retrieve(["   "])
        with uvicorn_thread(Service(index, ServeParams(), api_key=KEY)) as url:
            with pytest.raises(RemoteError, match="API key") as refused:
                remote(url).retrieve(questions[:1])
            assert refused.value.status == 401
    bare = open_index(*bm25)
    with uvicorn_thread(Service(bare, ServeParams(), api_key=None)) as url:
        with pytest.raises(NoLLM, match="llm=local"):
            remote(url).answer(questions[:1])
    with pytest.raises(ValueError, match="not an http"):
        remote("127.0.0.1:8000")


class Busy:
    """A real HTTP server that answers 503 with ``Retry-After: 1`` for its first ``busy`` requests, then relays the
    real service's answer; it records when each request came."""

    def __init__(self, target: str, busy: int) -> None:
        import httpx

        self.target, self.busy, self.times = target, busy, []

        async def relay(request: Request) -> JSONResponse:
            self.times.append(time.monotonic())
            if len(self.times) <= self.busy:
                return JSONResponse({"error": "busy: retry shortly"}, 503, headers={"Retry-After": "1"})
            async with httpx.AsyncClient() as client:
                reply = await client.post(f"{self.target}/retrieve", content=await request.body(),
                                          headers={"content-type": "application/json"})
            return JSONResponse(reply.json(), reply.status_code)

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/retrieve", relay, methods=["POST"])]),
                                                    host="127.0.0.1", port=self.port, log_level="warning"))

    def __enter__(self) -> str:
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def test_a_503_is_retried_after_its_retry_after(bm25):
    questions = sample_questions(bm25)[:4]
    index = open_index(*bm25)
    with uvicorn_thread(Service(index, ServeParams(), api_key=None)) as target:
        busy = Busy(target, busy=2)
        with busy as url:
            same(remote(url).retrieve(questions, k=4), index.retrieve(questions, k=4))
            gaps = [b - a for a, b in zip(busy.times, busy.times[1:])]
            assert len(busy.times) == 3 and all(g >= 0.95 for g in gaps), gaps  # waited Retry-After each time
        busy = Busy(target, busy=10)
        with busy as url:
            with pytest.raises(RemoteError, match="503") as gave_up:
                asyncio.run(remote(url, retries=1).aretrieve(questions))
            assert gave_up.value.status == 503 and len(busy.times) == 2
