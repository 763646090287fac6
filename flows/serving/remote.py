"""A client for a remote ``dagrag serve``: :func:`remote` gives the :class:`~flows.serving.index.Index` interface
(``retrieve``, ``answer``, ``info``) over HTTP, returning the same :class:`Passage`, :class:`Ranked` and
:class:`Answer` objects, so code written against :func:`~flows.serving.index.open_index` runs unchanged.

>>> from flows.serving import remote
>>> index = remote("http://127.0.0.1:8000", api_key=None)
>>> [p.title for p in index.retrieve(["Who founded the Vell Guild?"], k=3)[0]]

A 503 (the server's queue is full) is retried after the ``Retry-After`` seconds it names, at most ``retries``
times. The async twins (:meth:`Remote.aretrieve`, :meth:`Remote.aanswer`) let many callers share the server's
micro-batching: concurrent requests are searched together there. Beyond the papers: serving.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Sequence

import httpx

from flows.runtime.preflight import NoLLM
from flows.serving.index import Answer, IndexInfo, Passage, Ranked

PASSAGE_FIELDS = tuple(f.name for f in dataclasses.fields(Passage))
INFO_FIELDS = tuple(f.name for f in dataclasses.fields(IndexInfo))


class RemoteError(RuntimeError):
    """The server refused a request: its status and its one-line ``error``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status}: {reason}")
        self.status, self.reason = status, reason


def passage_of(d: dict[str, Any]) -> Passage:
    """A ``/retrieve`` result → the :class:`Passage` ``open_index`` gives (fields the server adds that this
    version's Passage lacks are left out)."""
    return Passage(**{name: d[name] for name in PASSAGE_FIELDS if name in d})


def ranked_of(question: str, results: list[dict[str, Any]], trace: dict[str, Any] | None) -> Ranked:
    return Ranked(question, [passage_of(p) for p in results], trace)


def retry_after(response: httpx.Response, attempt: int) -> float:
    """Seconds to wait before the next try: the ``Retry-After`` header (seconds), else 0.5 s doubling."""
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return 0.5 * 2 ** attempt


def raise_for(response: httpx.Response) -> None:
    """A refused request → the exception ``open_index`` raises for the same mistake (422: ValueError, 501: NoLLM),
    else :class:`RemoteError`."""
    if response.is_success:
        return
    try:
        reason = response.json().get("error") or response.text
    except ValueError:
        reason = response.text.strip()[:200]
    if response.status_code == 422:
        raise ValueError(reason)
    if response.status_code == 501:
        raise NoLLM(reason)
    raise RemoteError(response.status_code, reason)


class Remote:
    """A served index, over HTTP: ``retrieve``/``answer`` (and their async twins) as :class:`Index` has them."""

    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 60.0, retries: int = 5) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"remote: {url!r} is not an http(s) URL; give the address `dagrag serve` printed, "
                             "e.g. http://127.0.0.1:8000")
        self.url, self.retries = url.rstrip("/"), retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)
        self._async: dict[int, httpx.AsyncClient] = {}  # one per event loop (an AsyncClient is bound to its loop)
        self._headers, self._timeout = headers, timeout_s

    # -- synchronous ---------------------------------------------------------------
    def _send(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        for attempt in range(self.retries + 1):
            response = self._client.request(method, path, json=payload)
            if response.status_code != 503 or attempt == self.retries:
                break
            time.sleep(retry_after(response, attempt))
        raise_for(response)
        return response.json()

    @property
    def info(self) -> IndexInfo:
        """What is served (``GET /index``)."""
        body = self._send("GET", "/index")
        return IndexInfo(**{name: body[name] for name in INFO_FIELDS if name in body})

    def retrieve(self, questions: Sequence[str] | str, k: int | None = None) -> list[Ranked]:
        """Ranked passages for each question (one request: the server searches them as one batch)."""
        batch = _batch(questions)
        if not batch:
            return []
        body = self._send("POST", "/retrieve", _request(batch, k))
        return [ranked_of(q, r, t) for q, r, t in zip(batch, body["results"], body["traces"])]

    def answer(self, questions: Sequence[str] | str, k: int | None = None) -> list[Answer]:
        """The server's LLM's answer to each question, with its passages (NoLLM when it has none)."""
        batch = _batch(questions)
        if not batch:
            return []
        return [answer_of(a) for a in self._send("POST", "/answer", _request(batch, k))["answers"]]

    # -- asynchronous ----------------------------------------------------------------
    def _aclient(self) -> httpx.AsyncClient:
        loop = id(asyncio.get_running_loop())
        if loop not in self._async:
            self._async[loop] = httpx.AsyncClient(base_url=self.url, headers=self._headers, timeout=self._timeout)
        return self._async[loop]

    async def _asend(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        client = self._aclient()
        for attempt in range(self.retries + 1):
            response = await client.request(method, path, json=payload)
            if response.status_code != 503 or attempt == self.retries:
                break
            await asyncio.sleep(retry_after(response, attempt))
        raise_for(response)
        return response.json()

    async def aretrieve(self, questions: Sequence[str] | str, k: int | None = None) -> list[Ranked]:
        """:meth:`retrieve` without blocking the event loop; concurrent calls share the server's batches."""
        batch = _batch(questions)
        if not batch:
            return []
        body = await self._asend("POST", "/retrieve", _request(batch, k))
        return [ranked_of(q, r, t) for q, r, t in zip(batch, body["results"], body["traces"])]

    async def aanswer(self, questions: Sequence[str] | str, k: int | None = None) -> list[Answer]:
        batch = _batch(questions)
        if not batch:
            return []
        return [answer_of(a) for a in (await self._asend("POST", "/answer", _request(batch, k)))["answers"]]

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "Remote":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def answer_of(d: dict[str, Any]) -> Answer:
    return Answer(d["question"], d["answer"], d["raw"], list(d["context"]),
                  ranked_of(d["question"], d["results"], d.get("trace")))


def _batch(questions: Sequence[str] | str) -> list[str]:
    return [questions] if isinstance(questions, str) else list(questions)


def _request(batch: list[str], k: int | None) -> dict[str, Any]:
    return {"questions": batch} if k is None else {"questions": batch, "k": int(k)}


def remote(url: str, api_key: str | None = None, timeout_s: float = 60.0, retries: int = 5) -> Remote:
    """A client for the ``dagrag serve`` at ``url`` (with ``api_key`` when the server has ``DAGRAG_API_KEY``)."""
    return Remote(url, api_key, timeout_s, retries)
