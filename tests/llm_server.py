"""A real, deterministic OpenAI-compatible chat server for offline tests.

``FakeLLMServer`` listens on 127.0.0.1 (random port) and answers
``POST /v1/chat/completions`` from the prompt alone:

* JSON requests (``response_format`` of type ``json_object`` or a prompt that
  mentions ``JSON``) get ``{"entities": [...], "answer": ..., "correct": true}``
  built from the first user message (so repair turns reproduce the task).
* Prompts containing ``Question:`` get a short reasoning line plus a final
  ``Answer: <last word of the question>``.
* Anything else is echoed back as ``Echo: <last user message>``.

Usage tokens are word counts (prompt: all message contents; completion: the
reply). Faults are scripted with :meth:`FakeLLMServer.script`; each scripted
fault is consumed by one request, in arrival order. The server stops on
context exit and, as a safety net, by itself after ``max_lifetime_s``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

FAULT_KINDS = ("rate_limit", "server_error", "delay", "malformed", "bad_json", "bad_request")


@dataclass
class Fault:
    """One scripted misbehaviour, consumed by a single request."""

    kind: str
    retry_after: float | None = None
    delay_s: float = 0.0


@dataclass
class ServerStats:
    """Counters updated by the handler threads (guarded by ``lock``)."""

    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    auth_headers: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _words(text: str) -> int:
    """Word count used as the fake token count."""
    return len(text.split())


def _content(msg: dict[str, Any]) -> str:
    """Text of a chat message (string content or list of text parts)."""
    c = msg.get("content") or ""
    if isinstance(c, list):
        return " ".join(str(p.get("text", "")) for p in c if isinstance(p, dict))
    return str(c)


def _last_user(messages: list[dict[str, Any]]) -> str:
    """Content of the last user message ('' if none)."""
    for msg in reversed(messages):
        if msg.get("role") == "user":
            return _content(msg)
    return ""


def _rule_answer(prompt: str) -> str:
    """Deterministic 'answer': the last word of the text after ``Question:``."""
    question = prompt.rsplit("Question:", 1)[-1].split("\n", 1)[0]
    words = re.findall(r"[A-Za-z0-9]+", question)
    return words[-1] if words else "unknown"


def _first_user(messages: list[dict[str, Any]]) -> str:
    """Content of the first user message ('' if none): the original task."""
    for msg in messages:
        if msg.get("role") == "user":
            return _content(msg)
    return ""


def _json_reply(prompt: str) -> str:
    """A schema-friendly JSON object derived from the (original) prompt."""
    entities = sorted(set(re.findall(r"\b[A-Z][a-z]+\b", prompt)))
    return json.dumps({"entities": entities, "answer": _rule_answer(prompt), "correct": True})


def deterministic_reply(body: dict[str, Any]) -> str:
    """The reply text the server gives for a (fault-free) request body."""
    messages = body.get("messages") or []
    prompt = _last_user(messages)
    everything = "\n".join(_content(m) for m in messages)
    wants_json = (body.get("response_format") or {}).get("type") == "json_object" or "JSON" in everything
    if wants_json:
        return _json_reply(_first_user(messages))
    if "Question:" in prompt:
        return f"Let me think step by step.\nAnswer: {_rule_answer(prompt)}"
    return f"Echo: {prompt}"


class FakeLLMServer:
    """Threaded OpenAI-compatible test server; use as a context manager."""

    def __init__(self, latency_s: float = 0.0, max_lifetime_s: float = 120.0,
                 poison: str | None = None, responder: Callable[[dict[str, Any]], str] | None = None) -> None:
        """``latency_s``: sleep for every request; ``poison``: any request whose
        messages contain this string always gets schema-invalid JSON content;
        ``responder``: a test's own reply rule (request body -> reply text), used
        instead of :func:`deterministic_reply`."""
        self.latency_s = latency_s
        self.max_lifetime_s = max_lifetime_s
        self.poison = poison
        self.responder = responder
        self.stats = ServerStats()
        self._faults: deque[Fault] = deque()
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Timer | None = None

    # ---- scripting -----------------------------------------------------
    def script(self, kind: str, n: int = 1, *, retry_after: float | None = None,
               delay_s: float = 0.0) -> None:
        """Queue ``n`` faults of ``kind`` (one of ``FAULT_KINDS``)."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        with self.stats.lock:
            self._faults.extend(Fault(kind, retry_after, delay_s) for _ in range(n))

    def _next_fault(self) -> Fault | None:
        with self.stats.lock:
            return self._faults.popleft() if self._faults else None

    # ---- properties ----------------------------------------------------
    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> int:
        with self.stats.lock:
            return self.stats.requests

    @property
    def max_in_flight(self) -> int:
        with self.stats.lock:
            return self.stats.max_in_flight

    # ---- lifecycle -----------------------------------------------------
    def start(self) -> "FakeLLMServer":
        """Bind to a random loopback port and serve in a daemon thread."""
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self._watchdog = threading.Timer(self.max_lifetime_s, self.stop)
        self._watchdog.daemon = True
        self._watchdog.start()
        return self

    def stop(self) -> None:
        """Stop serving (idempotent); wakes handlers sleeping in faults."""
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.cancel()
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()

    def __enter__(self) -> "FakeLLMServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sleep(self, seconds: float) -> None:
        """Sleep that returns early when the server stops."""
        if seconds > 0:
            self._stop.wait(seconds)


def _completion(body: dict[str, Any], text: str) -> dict[str, Any]:
    """An OpenAI chat.completion envelope around ``text``."""
    prompt_tokens = sum(_words(_content(m)) for m in body.get("messages") or [])
    completion_tokens = _words(text)
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "test-model"),
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def _make_handler(server: FakeLLMServer) -> type[BaseHTTPRequestHandler]:
    """Build a request-handler class bound to ``server``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return  # keep test output quiet

        def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # client gave up (e.g. its timeout fired)

        def _send_json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
            self._send(status, json.dumps(obj).encode(), headers)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            st = server.stats
            with st.lock:
                st.requests += 1
                st.in_flight += 1
                st.max_in_flight = max(st.max_in_flight, st.in_flight)
                st.auth_headers.append(self.headers.get("Authorization", ""))
            try:
                self._handle(raw)
            finally:
                with st.lock:
                    st.in_flight -= 1

        def _handle(self, raw: bytes) -> None:
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send_json(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                body = json.loads(raw)
            except json.JSONDecodeError:
                self._send_json(400, {"error": {"message": "request body is not JSON"}})
                return
            with server.stats.lock:
                server.stats.bodies.append(body)
            server.sleep(server.latency_s)
            fault = server._next_fault()
            if fault is not None and self._apply_fault(fault, body):
                return
            text = (server.responder or deterministic_reply)(body)
            everything = json.dumps(body.get("messages"))
            if server.poison and server.poison in everything:
                text = '{"wrong": "shape"}'
            self._send_json(200, _completion(body, text))

        def _apply_fault(self, fault: Fault, body: dict[str, Any]) -> bool:
            """Apply ``fault``; return True when the response was already sent."""
            if fault.kind == "rate_limit":
                headers = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
                self._send_json(429, {"error": {"message": "rate limited"}}, headers)
                return True
            if fault.kind == "server_error":
                self._send_json(500, {"error": {"message": "internal error"}})
                return True
            if fault.kind == "bad_request":
                self._send_json(400, {"error": {"message": "unsupported parameter"}})
                return True
            if fault.kind == "malformed":
                self._send(200, b'{"id": "chatcmpl-test", "choices": [ {{{ not json')
                return True
            if fault.kind == "bad_json":
                self._send_json(200, _completion(body, "```json\n{\"wrong\": \"shape\"}\n```"))
                return True
            if fault.kind == "delay":
                server.sleep(fault.delay_s)
            return False  # delay: fall through to a normal answer

    return Handler


def iter_auth_headers(server: FakeLLMServer) -> Iterator[str]:
    """Authorization headers received so far (for key-handling tests)."""
    with server.stats.lock:
        yield from list(server.stats.auth_headers)


try:  # a pytest fixture (tests/conftest.py registers this module as a plugin)
    import pytest

    @pytest.fixture
    def llm_server() -> Iterator[FakeLLMServer]:
        """A running ``FakeLLMServer``, stopped after the test."""
        with FakeLLMServer() as srv:
            yield srv
except ImportError:  # pragma: no cover - pytest is always present in tests
    pass
