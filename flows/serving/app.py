"""The HTTP service over one opened index (``dagrag serve``): FastAPI, served by uvicorn.

Endpoints: ``POST /retrieve`` and ``POST /answer`` (micro-batched, :mod:`flows.serving.batcher`), ``GET /health``,
``GET /index`` (what is served), ``GET /metrics`` (Prometheus text), ``POST /admin/reload`` (hot swap),
``GET /`` (the search page), ``GET /docs`` (OpenAPI; the contract is :mod:`flows.serving.schema`).

Bad input is answered with a 4xx status and ``{"error": "<one line>"}``, never a 500: the body is read here
(size-limited, UTF-8, JSON) and checked against a strict schema (unknown fields, wrong types, empty or
over-long questions, ``k`` out of range). With an API key (``DAGRAG_API_KEY``) every endpoint but
``/health`` needs ``Authorization: Bearer <key>``; ``/admin/*`` always needs it. The key is never logged.
A method an endpoint does not declare gets 405 (before the key is checked: what a path allows is no secret).
Without an LLM, ``/answer`` answers 501 and is left out of ``/openapi.json``: the schema lists what this server
can do, so a generated client has no method that always fails (and a contract fuzzer no operation that can only
answer 5xx).
"""
from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Callable, Literal

import orjson
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError
from starlette.exceptions import HTTPException

from flows.runtime.config import ServeParams
from flows.serving.batcher import BatchStats, MicroBatcher, QueueFull
from flows.serving.index import Index, IndexNotBuilt, NoLLM, by_document
from flows.serving.metrics import ServeMetrics
from flows.serving.schema import (NOT_BLANK, AnswerResponse, Health, IndexInfo, ReloadResponse, RetrieveResponse,
                                  errors, retrieve_request)

log = logging.getLogger("dagrag.serve")

API_KEY_ENV = "DAGRAG_API_KEY"
PUBLIC = frozenset({"/health"})


class RetrieveRequest(BaseModel):
    """``{"questions": [...], "k": 5}`` or ``{"question": "...", "k": 5}``; ``k`` defaults to ``method.top_k``;
    ``"group": "document"`` also returns the passages grouped by their document, best document first. Absent
    fields are None; an explicit ``null`` is refused, as the schema (:func:`retrieve_request`) says."""

    model_config = ConfigDict(extra="forbid")
    questions: list[StrictStr] = None  # type: ignore[assignment]  # (defaults are not validated: None = absent)
    question: StrictStr = None  # type: ignore[assignment]
    k: StrictInt = None  # type: ignore[assignment]
    group: Literal["passage", "document"] = None  # type: ignore[assignment]


_NOT_BLANK = re.compile(NOT_BLANK)


def bearer_matches(given: str, key: str) -> bool:
    """Whether an Authorization header (``given``) is ``Bearer <key>`` (compared in constant time)."""
    scheme, _, token = given.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), key.encode())


class BadRequest(Exception):
    """A request the service refuses: a status and a one-line reason."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.headers = status, reason, headers or {}


class Service:
    """The served index (swapped atomically on reload), its batcher, limits and metrics."""

    def __init__(self, index: Index, params: ServeParams, api_key: str | None,
                 reopen: Callable[[], Index] | None = None, resolve_fp: Callable[[], str] | None = None) -> None:
        self.index, self.params, self.api_key = index, params, api_key
        self.reopen, self.resolve_fp = reopen, resolve_fp
        self.metrics = ServeMetrics()
        self.metrics.index_loaded(index.info)
        self.batcher: MicroBatcher | None = None
        self.arriving = 0  # retrieve/answer requests accepted whose questions are not queued yet
        self._reload_lock = asyncio.Lock()
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dagrag-reload")
        self.reloads = 0

    # -- request checks ----------------------------------------------------------
    def authorise(self, path: str, given: str) -> None:
        """``given``: the request's Authorization header ("" when absent)."""
        admin = path.startswith("/admin/")
        if path in PUBLIC or (self.api_key is None and not admin):
            return
        if self.api_key is None:
            raise BadRequest(403, f"/admin/ endpoints need an API key: start the server with {API_KEY_ENV} set and "
                                  "send Authorization: Bearer <key>")
        if not bearer_matches(given, self.api_key):
            raise BadRequest(401, "missing or wrong API key: send Authorization: Bearer <key>",
                             {"WWW-Authenticate": "Bearer"})

    async def body(self, request: Request) -> Any:
        """The request's JSON body: at most ``serve.max_body_bytes``, UTF-8, valid JSON."""
        limit = self.params.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BadRequest(413, f"body of {declared} bytes is over serve.max_body_bytes={limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BadRequest(413, f"body is over serve.max_body_bytes={limit}")
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadRequest(400, f"body is not UTF-8 (byte offset {err.start})") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise BadRequest(400, f"body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None

    def questions_of(self, payload: Any) -> tuple[list[str], int]:
        """(questions, k) of a checked request body."""
        if not isinstance(payload, dict):
            raise BadRequest(422, f"body must be a JSON object, not {type(payload).__name__}")
        k = payload.get("k")
        if isinstance(k, float) and k.is_integer():  # 5.0 is an integer to JSON Schema, so to this API too
            payload = {**payload, "k": int(k)}
        try:
            req = RetrieveRequest.model_validate(payload)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "body"
            raise BadRequest(422, f"{where}: {first.get('msg', 'invalid')}") from None
        if (req.questions is None) == (req.question is None):
            raise BadRequest(422, "give exactly one of 'question' (a string) or 'questions' (a list of strings)")
        questions = req.questions if req.questions is not None else [req.question]
        p = self.params
        if not questions:
            raise BadRequest(422, "questions is empty")
        if len(questions) > p.max_questions:
            raise BadRequest(422, f"{len(questions)} questions in one request; serve.max_questions={p.max_questions}")
        for i, q in enumerate(questions):
            if not _NOT_BLANK.search(q):
                raise BadRequest(422, f"question {i + 1} is empty")
            try:
                q.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(422, f"question {i + 1} is not valid Unicode (a lone surrogate escape)") from None
            if len(q) > p.max_question_chars:
                raise BadRequest(422, f"question {i + 1} has {len(q)} characters; "
                                      f"serve.max_question_chars={p.max_question_chars}")
        k = self.index.default_k if req.k is None else req.k
        if not 1 <= k <= p.max_k:
            raise BadRequest(422, f"k must be between 1 and serve.max_k={p.max_k}, got {k}")
        return questions, k

    # -- answering ---------------------------------------------------------------
    async def retrieve(self, questions: list[str], k: int) -> tuple[list[Any], Index]:
        """Each question's :class:`~flows.serving.index.Ranked`, from the index served when it arrived."""
        index = self.index
        try:
            return await self.batcher.submit(index, questions, k), index
        except QueueFull as err:
            self.metrics.errors.labels("queue_full").inc()
            raise BadRequest(503, f"busy: {err}; retry shortly", {"Retry-After": "1"}) from None

    def on_batch(self, stats: BatchStats) -> None:
        self.metrics.batch(stats)

    def search(self, index: Index, questions: list[str], k: int) -> list[Any]:
        """One batched search (on the batcher's worker thread); its parts go to the metrics."""
        hits = index.search(questions, k)
        self.metrics.parts(hits.parts)
        return index.ranked(questions, hits)

    # -- reloads -----------------------------------------------------------------
    async def reload(self, force: bool = False) -> dict[str, Any]:
        """Open the index the settings now name beside the served one, then swap; the old one serves what was
        queued on it. Unchanged fingerprint: nothing is loaded."""
        if self.reopen is None:
            raise BadRequest(501, "this service was started without a way to reopen its index")
        async with self._reload_lock:
            loop = asyncio.get_running_loop()
            try:
                if not force and self.resolve_fp is not None:
                    fp = await loop.run_in_executor(self._loader, self.resolve_fp)
                    if fp == self.index.info.fingerprint:
                        return {"reloaded": False, "index": index_payload(self.index, self)}
                new = await loop.run_in_executor(self._loader, self.reopen)
            except IndexNotBuilt as err:
                raise BadRequest(409, str(err)) from None
            old = self.index
            if new.info.fingerprint == old.info.fingerprint and not force:
                return {"reloaded": False, "index": index_payload(old, self)}
            self.index = new  # one assignment: every request after it is queued on the new index
            self.reloads += 1
            self.metrics.index_loaded(new.info)
            log.info("hot swap: now serving index %s (built %s), was %s", new.info.fingerprint, new.info.built_at,
                     old.info.fingerprint)
            return {"reloaded": True, "index": index_payload(new, self), "previous": old.info.fingerprint}

    async def watch(self) -> None:
        """``serve.watch``: reload when the catalog holds a newer build of the same settings."""
        while True:
            await asyncio.sleep(self.params.watch_s)
            try:
                await self.reload()
            except BadRequest as err:  # a grown corpus whose index is not built yet: keep serving the old one
                log.debug("watch: %s", err.reason)
            except Exception as err:  # noqa: BLE001 - a watch must not stop the service
                log.warning("watch: reload failed: %s", err)

    def close(self) -> None:
        self._loader.shutdown(wait=False)


def index_payload(index: Index, service: Service) -> dict[str, Any]:
    return {**index.info.to_dict(), "reloads": service.reloads}


def create_app(service: Service) -> FastAPI:
    """The FastAPI app over ``service``."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.batcher = MicroBatcher(service.search, service.params.max_batch,
                                       service.params.max_wait_ms, service.params.max_queue, service.on_batch,
                                       arriving=lambda: service.arriving)
        service.batcher.start()
        watcher = asyncio.get_running_loop().create_task(service.watch()) if service.params.watch else None
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
            await service.batcher.stop()
            service.close()

    app = FastAPI(title="dagrag", version="1", lifespan=lifespan,
                  description="Retrieve from a built dagrag index: micro-batched, one method, one index at a time.")

    allowed: dict[str, frozenset[str]] = {}  # path → the methods its routes declare, filled once they exist
    app.add_middleware(Guard, service=service, allowed=allowed)

    @app.exception_handler(Exception)
    async def internal(request: Request, err: Exception) -> JSONResponse:  # a bug: still one line; serving goes on
        log.error("unexpected error on %s: %r", request.url.path, err, exc_info=err)
        service.metrics.errors.labels("internal").inc()
        return JSONResponse({"error": f"internal error: {type(err).__name__}"}, 500)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, err: BadRequest) -> JSONResponse:
        if err.status < 500 or err.status == 503:
            service.metrics.errors.labels(f"http_{err.status}").inc()
        return JSONResponse({"error": err.reason}, err.status, headers=err.headers)

    @app.exception_handler(HTTPException)
    async def not_found(request: Request, err: HTTPException) -> JSONResponse:  # an unknown path: the same body
        return JSONResponse({"error": f"{err.detail}: {request.method} {request.url.path}"}, err.status_code,
                            headers=err.headers)

    body = {"requestBody": {"required": True, "content": {"application/json": {
        "schema": retrieve_request(service.params)}}}}
    asking = errors(400, 401, 413, 422, 503)

    @app.post("/retrieve", openapi_extra=body, summary="Ranked passages for one or several questions",
              response_model=None, responses={200: {"model": RetrieveResponse}, **asking})
    async def retrieve(request: Request) -> Response:
        service.arriving += 1
        try:
            payload = await service.body(request)
            questions, k = service.questions_of(payload)
        finally:
            service.arriving -= 1
        results, index = await service.retrieve(questions, k)
        started = time.perf_counter()
        out = {"results": [[p.to_dict() for p in r] for r in results], "traces": [r.trace for r in results],
               "index": index_payload(index, service)}
        if payload.get("group") == "document":  # checked by RetrieveRequest
            out["documents"] = [by_document(r) for r in results]
        body = orjson.dumps(out)
        service.metrics.serialise.inc(time.perf_counter() - started)
        return Response(body, media_type="application/json")

    @app.post("/answer", openapi_extra=body, summary="Answers from the configured LLM, with their passages",
              response_model=None, responses={200: {"model": AnswerResponse}, **asking, **errors(501)},
              include_in_schema=has_llm(service.index))
    async def answer(request: Request) -> JSONResponse:
        index = service.index
        try:
            index.llm_client()
        except NoLLM as err:
            raise BadRequest(501, str(err)) from None
        questions, k = service.questions_of(await service.body(request))
        results, index = await service.retrieve(questions, k)
        answers = await asyncio.get_running_loop().run_in_executor(None, index.answer_ranked, results)
        return JSONResponse({"answers": [a.to_dict() for a in answers], "index": index_payload(index, service)})

    @app.get("/health", summary="Liveness: the process serves", response_model=Health)
    async def health() -> dict[str, Any]:
        return {"status": "ok", "index": service.index.info.fingerprint}

    @app.get("/index", summary="The served index: method, dataset, settings, fingerprint, build time",
             response_model=None, responses={200: {"model": IndexInfo}, **errors(401)})
    async def index_info() -> JSONResponse:
        return JSONResponse(index_payload(service.index, service))

    @app.get("/metrics", summary="Prometheus metrics (the text exposition format)", response_class=PlainTextResponse,
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}, **errors(401)})
    async def metrics() -> Response:
        service.metrics.queue_depth.set(service.batcher.depth if service.batcher else 0)
        body, kind = service.metrics.render()
        return Response(body, media_type=kind)

    force = {"parameters": [{"name": "force", "in": "query", "required": False,
                             "schema": {"type": "boolean", "default": False},
                             "description": "reload even when the fingerprint is unchanged"}]}

    @app.post("/admin/reload", summary="Load the newest build of the served settings and swap it in",
              openapi_extra=force, response_model=None,
              responses={200: {"model": ReloadResponse}, **errors(401, 403, 409, 422, 501)})
    async def reload(request: Request) -> JSONResponse:
        flag = request.query_params.get("force", "false")
        if flag.lower() not in ("true", "false"):
            raise BadRequest(422, f"force must be true or false, got {flag!r}")
        return JSONResponse(await service.reload(force=flag.lower() == "true"))

    @app.get("/", response_class=HTMLResponse, summary="The search page", responses=errors(401))
    async def page() -> HTMLResponse:
        return HTMLResponse(search_page())

    for route in app.routes:
        methods = getattr(route, "methods", None)
        if methods:
            allowed[route.path] = frozenset(allowed.get(route.path, frozenset()) | methods)
    app.openapi = lambda: contract(app, service)  # type: ignore[method-assign]
    return app


def has_llm(index: Index) -> bool:
    """Whether ``index`` has an LLM to answer with (decides whether ``/answer`` is in the schema)."""
    try:
        index.llm_client()
    except NoLLM:
        return False
    return True


def contract(app: FastAPI, service: Service) -> dict[str, Any]:
    """``/openapi.json``: FastAPI's schema of the routes, plus the bearer scheme on every endpoint that needs
    the key (all but ``/health`` when one is set; ``/admin/*`` always)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schema.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": f"the server's {API_KEY_ENV}"}}
        for path, operations in schema["paths"].items():
            for op in operations.values():
                keyed = path.startswith("/admin/") or (service.api_key is not None and path not in PUBLIC)
                op["security"] = [{"bearer": []}] if keyed else []
                responses = op.get("responses", {})
                if not keyed:
                    responses.pop("401", None)
                for status, response in responses.items():  # errors are JSON whatever the success is
                    if int(status) >= 400:
                        response["content"] = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        app.openapi_schema = schema
    return app.openapi_schema


class Guard:
    """ASGI middleware around every HTTP request: a method the path does not declare (405), the API key, then
    metrics (endpoint, status, seconds). Plain ASGI rather than ``@app.middleware``: no stream wrapping of each
    response, so it costs microseconds."""

    def __init__(self, app: Any, service: Service, allowed: dict[str, frozenset[str]]) -> None:
        self.app, self.service, self.allowed = app, service, allowed

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        path = scope["path"]
        status = [500]

        async def sending(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            auth = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), "")
            methods = self.allowed.get(path)
            try:
                if methods is not None and scope["method"] not in methods:
                    raise BadRequest(405, f"{path} does not take {scope['method']}; it takes "
                                          f"{', '.join(sorted(methods))}", {"Allow": ", ".join(sorted(methods))})
                self.service.authorise(path, auth)
            except BadRequest as err:
                self.service.metrics.errors.labels(f"http_{err.status}").inc()
                await JSONResponse({"error": err.reason}, err.status, headers=err.headers)(scope, receive, sending)
                return
            await self.app(scope, receive, sending)
        finally:
            self.service.metrics.request(path if path in ENDPOINTS else "other", status[0],
                                         time.perf_counter() - started)


ENDPOINTS = frozenset({"/retrieve", "/answer", "/health", "/index", "/metrics", "/admin/reload", "/"})


def search_page() -> str:
    """The search page (plain HTML, CSS and JS in ``flows/serving/page.html``; nothing fetched from elsewhere)."""
    return resources.files("flows.serving").joinpath("page.html").read_text(encoding="utf-8")
