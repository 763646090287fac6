"""``dagrag serve`` as a real process on a loopback port, driven by real HTTP clients: bad input, back-pressure,
the API key, a hot swap under load, and a graceful stop."""
from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from flows.runtime.pipeline import index_flow
from flows.serving.index import open_index
from tasks.data.sample import generate_sample
from tests.flows.conftest import make_config
from tests.flows.serving_helpers import REPO, ServeProcess, post

KEY = "test-key-0123456789"


def write_jsonl(path: Path, corpus: list[dict]) -> None:
    path.write_text("".join(json.dumps({"title": d["title"], "text": d["text"]}) + "\n" for d in corpus))


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A bm25 index on a JSONL corpus of 50 passages (the corpus file can grow): (overrides, corpus, path)."""
    root = tmp_path_factory.mktemp("serve-http")
    corpus, questions = generate_sample(80, 10, seed=5)
    path = root / "corpus.jsonl"
    write_jsonl(path, corpus[:50])
    overrides = ["method=bm25", "dataset=jsonl", f"dataset.path={path}", f"artifacts_dir={root / 'artifacts'}"]
    index_flow(make_config(root, *overrides))
    return overrides, corpus, path, [q["question"] for q in questions]


def offline(overrides: list[str], questions: list[str], k: int) -> list[list[str]]:
    return [[p.doc_id for p in r] for r in open_index(*overrides).retrieve(questions, k)]


MALFORMED: list[tuple[bytes | dict | list | str | None, int]] = [
    ({"question": ""}, 422), ({"question": "   \t"}, 422), ({"question": "x" * 301}, 422),
    ({"question": "q", "k": 0}, 422), ({"question": "q", "k": -3}, 422), ({"question": "q", "k": 51}, 422),
    ({"question": "q", "k": "5"}, 422), ({"question": "q", "k": 2.5}, 422), ({"question": 5}, 422),
    ({"questions": "one string"}, 422), ({"questions": [1, 2]}, 422), ({"questions": []}, 422),
    ({"question": "q", "questions": ["q"]}, 422), ({}, 422), ({"question": "q", "extra": 1}, 422),
    ([{"question": "q"}], 422), ("just a string", 422), (None, 422),
    (b"{not json", 400), (b'{"question": "caf\xe9"}', 400), (b"\xff\xfe\x00", 400), (b"", 400),
    (b'{"question": "' + b"a" * 5000 + b'"}', 413),
]


def send_raw(client: httpx.Client | httpx.AsyncClient, body):
    if isinstance(body, bytes):
        return client.post("/retrieve", content=body, headers={"content-type": "application/json"})
    return client.post("/retrieve", content=json.dumps(body).encode(), headers={"content-type": "application/json"})


def test_bad_input_flood_never_breaks_the_service(grown):
    overrides, _, _, questions = grown
    limits = ["serve.max_question_chars=300", "serve.max_k=50", "serve.max_body_bytes=4096"]
    expected = offline(overrides, questions, 5)
    with ServeProcess([*overrides, *limits]) as server:
        async def flood() -> list[tuple[httpx.Response, int | None, int | None]]:
            limit = asyncio.Semaphore(48)
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                async def one(body, status: int | None, question: int | None):
                    async with limit:
                        return await send_raw(client, body), status, question

                jobs = []
                for i in range(1100):  # 1,100 malformed, and a good one after every ten, all concurrent
                    body, status = MALFORMED[i % len(MALFORMED)]
                    jobs.append(one(body, status, None))
                    if i % 10 == 0:
                        q = i // 10 % len(questions)
                        jobs.append(one({"question": questions[q], "k": 5}, None, q))
                return await asyncio.gather(*jobs)

        results = asyncio.run(flood())
        bad = [(r, status) for r, status, _ in results if status is not None]
        good = [(r, q) for r, _, q in results if q is not None]
        assert len(bad) == 1100 and len(good) == 110
        for reply, status in bad:
            assert reply.status_code == status, (reply.request.content[:60], reply.status_code, reply.text)
            error = reply.json()["error"]
            assert error and "\n" not in error and "Traceback" not in error
        for reply, q in good:
            assert reply.status_code == 200, reply.text
            assert [p["doc_id"] for p in reply.json()["results"][0]] == expected[q]
        assert httpx.get(f"{server.url}/health").json()["status"] == "ok"  # still up
        metrics = httpx.get(f"{server.url}/metrics").text
        assert 'dagrag_requests_total{endpoint="/retrieve",status="422"}' in metrics
        code, err = server.stop()
    assert code == 0, err
    assert "Traceback" not in err and "Warning" not in err  # nothing per request on the server's console


def test_back_pressure_503_with_retry_after_then_recovers(grown):
    overrides, _, _, questions = grown
    expected = offline(overrides, questions[:8], 5)
    with ServeProcess([*overrides, "serve.max_queue=8", "serve.max_batch=8", "serve.max_wait_ms=200"]) as server:
        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
                return await asyncio.gather(*(client.post("/retrieve", json={"questions": questions[:8], "k": 5})
                                              for _ in range(40)))

        replies = asyncio.run(burst())
        busy = [r for r in replies if r.status_code == 503]
        ok = [r for r in replies if r.status_code == 200]
        assert busy and ok and len(busy) + len(ok) == 40
        assert all(r.headers.get("retry-after") == "1" and "max_queue" in r.json()["error"] for r in busy)
        for r in ok:
            assert [[p["doc_id"] for p in res] for res in r.json()["results"]] == expected
        after = post(f"{server.url}/retrieve", {"questions": questions[:8], "k": 5})
        assert after.status_code == 200  # the queue drained: served again
        assert server.stop()[0] == 0


def test_api_key_required_beyond_health_and_on_admin(grown):
    overrides, _, _, questions = grown
    with ServeProcess(overrides, env={"DAGRAG_API_KEY": KEY}) as server:
        url = server.url
        assert httpx.get(f"{url}/health").status_code == 200
        assert post(f"{url}/retrieve", {"question": questions[0]}).status_code == 401
        assert post(f"{url}/retrieve", {"question": questions[0]},
                    headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{url}/index").status_code == 401
        good = post(f"{url}/retrieve", {"question": questions[0]}, headers={"Authorization": f"Bearer {KEY}"})
        assert good.status_code == 200
        assert httpx.post(f"{url}/admin/reload").status_code == 401
        assert httpx.post(f"{url}/admin/reload", headers={"Authorization": f"Bearer {KEY}"}).json()["reloaded"] is False
        code, err = server.stop()
    assert code == 0 and KEY not in err and KEY not in "".join(server.lines)


def test_admin_needs_a_key_even_on_loopback(grown):
    overrides, _, _, _ = grown
    with ServeProcess(overrides, env={"DAGRAG_API_KEY": ""}) as server:
        reply = httpx.post(f"{server.url}/admin/reload")
        assert reply.status_code == 403 and "DAGRAG_API_KEY" in reply.json()["error"]
        assert server.stop()[0] == 0


def test_beyond_loopback_without_a_key_is_refused_before_binding(grown):
    overrides, _, _, _ = grown
    env = {k: v for k, v in os.environ.items() if k != "DAGRAG_API_KEY"}
    done = subprocess.run([sys.executable, "-m", "flows.cli", "serve", *overrides, "serve.host=0.0.0.0"],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [done.stderr.strip().splitlines()[-1]]
    assert re.match(r"error: serve.host=0.0.0.0 .*DAGRAG_API_KEY", done.stderr.strip())


def test_swap_under_load_fails_no_request(grown, tmp_path):
    overrides, corpus, path, questions = grown
    before = open_index(*overrides).info.fingerprint
    with ServeProcess(overrides, env={"DAGRAG_API_KEY": KEY}) as server:
        auth = {"Authorization": f"Bearer {KEY}"}
        replies: list[httpx.Response] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(base_url=server.url, headers=auth, timeout=60) as client:
                i = 0
                while not stop.is_set():
                    replies.append(client.post("/retrieve", json={"question": questions[i % len(questions)], "k": 5}))
                    i += 1

        workers = [threading.Thread(target=load) for _ in range(4)]
        for w in workers:
            w.start()
        time.sleep(0.5)
        write_jsonl(path, corpus[:80])  # the corpus grew; its index is built while the old one serves
        try:
            index_flow(make_config(tmp_path, *overrides))
            swap = httpx.post(f"{server.url}/admin/reload", headers=auth, timeout=120).json()
            time.sleep(0.5)
        finally:
            stop.set()
            for w in workers:
                w.join()
            write_jsonl(path, corpus[:50])  # the module's other tests serve the 50-passage index
        assert swap["reloaded"] is True and swap["previous"] == before
        assert len(replies) > 20 and all(r.status_code == 200 for r in replies)
        served = {r.json()["index"]["fingerprint"] for r in replies}
        assert served == {before, swap["index"]["fingerprint"]}  # both indexes answered, nothing failed
        info = httpx.get(f"{server.url}/index", headers=auth).json()
        assert info["fingerprint"] == swap["index"]["fingerprint"] and info["n_documents"] == 80
        assert info["reloads"] == 1
        code, err = server.stop()
        assert code == 0
        assert f"hot swap: now serving index {swap['index']['fingerprint']}" in err and f"was {before}" in err, err


class HeldRequest:
    """A ``POST /retrieve`` on a raw socket, sent as ``Expect: 100-continue`` headers first: the server's
    ``100 Continue`` is proof that the app has taken the request and waits for its body (uvicorn writes it when the
    app first reads the body); :meth:`release` sends the body, :meth:`reply` reads the answer."""

    def __init__(self, port: int, question: str, k: int) -> None:
        self.body = json.dumps({"question": question, "k": k}).encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(self.body))

    def taken(self) -> None:
        """Return once the app waits for this request's body (its ``100 Continue`` came)."""
        got = b""
        while not got.endswith(b"\r\n\r\n"):
            chunk = self.sock.recv(1)
            assert chunk, f"the server closed the connection before its 100 Continue: {got!r}"
            got += chunk
        assert got.startswith(b"HTTP/1.1 100"), got

    def release(self) -> None:
        self.sock.sendall(self.body)

    def reply(self) -> tuple[int, bytes]:
        response = http.client.HTTPResponse(self.sock)
        response.begin()
        status, body = response.status, response.read()
        self.sock.close()
        return status, body


def queue_depth(url: str) -> float:
    """The service's ``dagrag_queue_depth`` gauge: questions waiting in the batcher."""
    text = httpx.get(f"{url}/metrics", timeout=60).text
    return float(re.search(r"^dagrag_queue_depth (\S+)$", text, re.M).group(1))


def test_sigterm_finishes_requests_in_flight_and_exits_0(grown):
    """SIGTERM while five requests are in flight, on conditions the server reports rather than on sleeps: four
    wait in the batcher (the ``dagrag_queue_depth`` gauge says 4; it holds them while a fifth is being read, and
    ``serve.max_wait_ms`` is far longer than the test), the fifth has been taken by the app (its ``100 Continue``
    came) but not yet given its body. That body is sent only once the signal is handled (its line printed) and the
    server has stopped taking connections, so no answer can leave before the drain began; all five are then
    answered right, and the process exits 0 within ``serve.drain_s``."""
    overrides, _, _, questions = grown
    expected = offline(overrides, questions[:5], 3)
    server = ServeProcess([*overrides, "serve.max_wait_ms=60000", "serve.max_batch=64", "serve.drain_s=10"])
    with server:
        held = [HeldRequest(server.port, q, 3) for q in questions[:5]]
        for h in held:
            h.taken()
        for h in held[:4]:
            h.release()
        deadline = time.monotonic() + 60
        while queue_depth(server.url) != 4:  # the four wait for a batch: the fifth is still being read
            assert time.monotonic() < deadline, "the four released questions never reached the batcher"
            time.sleep(0.05)
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        while not any("stopping: no new requests" in line for line in list(server.errors)):
            assert server.proc.poll() is None and time.monotonic() - t0 < 60, "".join(server.errors)
            time.sleep(0.02)
        while True:  # its shutdown has begun: it takes no new connection (the five it holds stay open)
            try:
                httpx.get(f"{server.url}/health", timeout=5)
            except httpx.ConnectError:
                break
            assert time.monotonic() - t0 < 60, "the server still takes connections after SIGTERM"
            time.sleep(0.02)
        # past uvicorn's 0.1 s pause before the drain, so that the drain (serve.drain_s) is what keeps the five
        # alive: with serve.drain_s=0.01 they are cancelled and this test fails (checked); the pass never depends
        # on this pause, as the drain is 10 s
        time.sleep(0.3)
        held[4].release()
        replies = [h.reply() for h in held]
        server.proc.wait(timeout=60)  # no second signal: the first one stops it
        code, err = server.stop()
        assert code == 0 and time.monotonic() - t0 < 10, (code, err)
        assert [status for status, _ in replies] == [200] * 5, replies
        assert [[p["doc_id"] for p in json.loads(body)["results"][0]] for _, body in replies] == expected
        assert "Traceback" not in err
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.url}/health")


def test_watch_swaps_in_a_newer_build_by_itself(grown, tmp_path):
    overrides, corpus, path, questions = grown
    before = open_index(*overrides).info.fingerprint
    with ServeProcess([*overrides, "serve.watch=true", "serve.watch_s=0.5"]) as server:
        write_jsonl(path, corpus[:80])
        try:
            index_flow(make_config(tmp_path, *overrides))  # the scheduled build of the grown corpus
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                info = httpx.get(f"{server.url}/index").json()
                if info["fingerprint"] != before:
                    break
                time.sleep(0.2)
        finally:
            write_jsonl(path, corpus[:50])
        assert info["fingerprint"] != before and info["n_documents"] == 80 and info["reloads"] == 1
        assert post(f"{server.url}/retrieve", {"question": questions[0]}).status_code == 200
        assert server.stop()[0] == 0
