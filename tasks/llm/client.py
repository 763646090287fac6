"""LLM access layer: an OpenAI-compatible chat client with a response cache.

Pieces (all pure library code; flows wire them in):

* :class:`LLMParams` — frozen config (mirrors the Hydra ``llm`` group).
* :func:`make_client` — returns ``None`` for ``provider="none"`` so callers can
  skip LLM work, else an :class:`LLMClient`.
* :class:`LLMClient` — sync ``openai.OpenAI`` client (its own retries disabled)
  plus: bounded thread-pool concurrency, per-request timeouts, retries with
  exponential backoff + jitter on 429/5xx/connection errors/timeouts/malformed
  bodies (``Retry-After`` honoured), a DuckDB response cache, a token ledger,
  structured JSON outputs validated against a small JSON-schema subset.
* :class:`ResponseCache` — the DuckDB cache (short-lived connections, writes
  guarded by ``fcntl.flock`` on ``<path>.lock``).

The API key is read from the environment variable named by
``LLMParams.api_key_env`` at client construction and handed only to the
``openai`` client: it is never logged, cached, or part of a cache key.

Token estimates (:func:`estimate_tokens`) use the common ~4 characters per
token heuristic for English text plus a few tokens of per-message overhead; it
is meant for budgeting, not billing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
import os
import random
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import duckdb

log = logging.getLogger(__name__)

Message = dict[str, Any]
Messages = list[Message]

PROVIDERS = ("none", "openai", "local")
SAMPLING_KEYS = ("temperature", "max_tokens", "seed", "response_format")
CACHE_KEY_VERSION = 1
CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
JSON_FORMAT: dict[str, str] = {"type": "json_object"}


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------
class LLMError(RuntimeError):
    """Base class for LLM-layer errors."""


class LLMConfigError(LLMError):
    """Invalid or incomplete LLM configuration (e.g. missing API key env var)."""


class LLMUnreachable(LLMError):
    """The endpoint kept failing with transient errors until retries ran out."""


class LLMRequestError(LLMError):
    """The endpoint rejected the request with a non-retryable 4xx status."""


class LLMBadResponse(LLMError):
    """The endpoint kept returning bodies that are not valid chat completions."""


class ExtractionMostlyEmpty(LLMError):
    """Too many outputs of an extraction stage were empty or invalid."""


class LLMDryRun(Exception):
    """Raised by an index stage in dry-run mode instead of calling the LLM: what it would spend.

    Nothing is written for that stage (the exception leaves ``compute`` before any write); the
    flow catches it, reports ``estimate`` and stops.
    """

    def __init__(self, stage: str, estimate: dict[str, int]) -> None:
        super().__init__(f"LLM dry run: stage {stage!r} would make {estimate}")
        self.stage, self.estimate = stage, estimate


# --------------------------------------------------------------------------
# Config and results
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class LLMParams:
    """LLM configuration. ``api_key_env`` names the env var holding the key.

    ``json_mode`` controls whether :meth:`LLMClient.chat_json` sends
    ``response_format={"type": "json_object"}`` (some servers reject it).
    """

    provider: str = "none"
    model: str = ""
    base_url: str = ""
    api_key_env: str = ""
    temperature: float = 0.0
    max_tokens: int = 512
    timeout_s: float = 60.0
    max_retries: int = 5
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    concurrency: int = 8
    seed: int = 0
    json_mode: bool = True

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise LLMConfigError(f"llm.provider must be one of {PROVIDERS}, got {self.provider!r}")
        if self.concurrency < 1 or self.max_retries < 0 or self.timeout_s <= 0:
            raise LLMConfigError("llm.concurrency >= 1, llm.max_retries >= 0 and llm.timeout_s > 0 required")


@dataclass(frozen=True)
class LLMResult:
    """One chat completion (fresh or from the cache)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    cached: bool
    seconds: float


@dataclass(frozen=True)
class LedgerEntry:
    """One request as seen by the ledger (cache hits have zero tokens)."""

    stage: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    cache_hit: bool


# --------------------------------------------------------------------------
# Token estimates and cache keys
# --------------------------------------------------------------------------
def _content_text(message: Message) -> str:
    """Text of a message whose content is a string or a list of text parts."""
    content = message.get("content") or ""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def estimate_text_tokens(text: str) -> int:
    """Heuristic token count of ``text``: ceil(chars / 4)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def estimate_tokens(messages: Sequence[Message]) -> int:
    """Heuristic prompt size: ~4 chars/token per content + 4 tokens per message."""
    return sum(estimate_text_tokens(_content_text(m)) + MESSAGE_OVERHEAD_TOKENS for m in messages)


def cache_key(model: str, messages: Sequence[Message], sampling: dict[str, Any]) -> str:
    """sha256 of canonical JSON of (model, messages, sampling params)."""
    payload = {"v": CACHE_KEY_VERSION, "model": model, "messages": list(messages),
               "sampling": {k: sampling.get(k) for k in SAMPLING_KEYS}}
    canon = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------
# Response cache
# --------------------------------------------------------------------------
CachedRow = tuple[str, int, int]  # (text, prompt_tokens, completion_tokens)


class ResponseCache:
    """DuckDB-backed response cache; every operation opens and closes a connection.

    Reads take a shared ``flock`` and writes an exclusive one on ``<path>.lock``
    so concurrent processes never hold conflicting DuckDB handles.
    """

    _thread_lock = threading.Lock()

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.lock_path = Path(f"{self.path}.lock")

    @contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        """Hold the in-process lock and the cross-process file lock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._thread_lock, open(self.lock_path, "a+") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def get_many(self, keys: Sequence[str]) -> dict[str, CachedRow]:
        """Cached rows for ``keys`` (missing keys are absent from the result)."""
        if not keys:
            return {}
        with self._locked(exclusive=False):
            if not self.path.exists():
                return {}
            con = duckdb.connect(str(self.path), read_only=True)
            try:
                rows = con.execute(
                    "SELECT c.key, c.response, c.prompt_tokens, c.completion_tokens "
                    "FROM llm_cache c JOIN (SELECT unnest(?::VARCHAR[]) AS k) q ON c.key = q.k",
                    [list(dict.fromkeys(keys))],
                ).fetchall()
            except duckdb.CatalogException:
                rows = []
            finally:
                con.close()
        return {k: (text, int(pt), int(ct)) for k, text, pt, ct in rows}

    def put_many(self, rows: dict[str, CachedRow], model: str) -> None:
        """Insert/replace ``rows`` (key -> (text, prompt_tokens, completion_tokens))."""
        if not rows:
            return
        keys = list(rows)
        with self._locked(exclusive=True):
            con = duckdb.connect(str(self.path))
            try:
                con.execute(
                    "CREATE TABLE IF NOT EXISTS llm_cache (key VARCHAR PRIMARY KEY, model VARCHAR, "
                    "response VARCHAR, prompt_tokens BIGINT, completion_tokens BIGINT, "
                    "created_at TIMESTAMP DEFAULT current_timestamp)"
                )
                con.execute(
                    "INSERT OR REPLACE INTO llm_cache (key, model, response, prompt_tokens, completion_tokens) "
                    "SELECT unnest(?::VARCHAR[]), ?, unnest(?::VARCHAR[]), unnest(?::BIGINT[]), unnest(?::BIGINT[])",
                    [keys, model, [rows[k][0] for k in keys], [rows[k][1] for k in keys],
                     [rows[k][2] for k in keys]],
                )
            finally:
                con.close()


# --------------------------------------------------------------------------
# JSON parsing and schema validation
# --------------------------------------------------------------------------
def parse_json_text(text: str) -> Any:
    """Parse a JSON value from model output (strips ``` fences, leading prose).

    Raises ``ValueError`` when no JSON value can be decoded.
    """
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else body.lstrip("`")
        body = body.rsplit("```", 1)[0]
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if not starts:
        raise ValueError("no JSON object or array found in the reply")
    value, _ = json.JSONDecoder().raw_decode(body[min(starts):])
    return value


_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def validate_schema(value: Any, schema: dict[str, Any], path: str = "$") -> str | None:
    """Validate ``value`` against a JSON-schema subset; return an error or None.

    Supported keywords: ``type`` (a name or list of names among object, array,
    string, number, integer, boolean, null), ``required``, ``properties``,
    ``items`` and ``enum``. Other keywords are ignored.
    """
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_TYPE_CHECKS[t](value) for t in names):
            return f"{path}: expected {'/'.join(names)}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: {value!r} not one of {schema['enum']!r}"
    if isinstance(value, dict):
        return _validate_object(value, schema, path)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            if (err := validate_schema(item, schema["items"], f"{path}[{i}]")) is not None:
                return err
    return None


def _validate_object(value: dict[str, Any], schema: dict[str, Any], path: str) -> str | None:
    """``required`` and ``properties`` checks for an object value."""
    for name in schema.get("required", []):
        if name not in value:
            return f"{path}: missing required property {name!r}"
    for name, sub in (schema.get("properties") or {}).items():
        if name in value and (err := validate_schema(value[name], sub, f"{path}.{name}")) is not None:
            return err
    return None


def _parse_and_validate(text: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """(value, None) when ``text`` holds schema-valid JSON, else (None, error)."""
    try:
        value = parse_json_text(text)
    except ValueError as exc:
        return None, f"reply is not valid JSON ({exc})"
    err = validate_schema(value, schema)
    return (value, None) if err is None else (None, err)


def repair_messages(messages: Messages, bad_reply: str, error: str, schema: dict[str, Any]) -> Messages:
    """Conversation asking the model to fix an invalid structured reply."""
    note = (f"Your previous reply could not be used: {error}. Reply again with only a JSON value "
            f"(no prose, no code fences) that satisfies this JSON schema: "
            f"{json.dumps(schema, sort_keys=True)}")
    return [*messages, {"role": "assistant", "content": bad_reply}, {"role": "user", "content": note}]


def is_empty_output(value: Any) -> bool:
    """True for None, empty str/list/dict, or a dict whose values are all empty."""
    if value is None:
        return True
    if isinstance(value, (str, list, tuple)):
        return len(value) == 0
    if isinstance(value, dict):
        return all(is_empty_output(v) for v in value.values())
    return False


def check_empty_fraction(outputs: Sequence[Any], max_empty_fraction: float, stage: str) -> float:
    """Return the empty fraction of ``outputs``; raise ``ExtractionMostlyEmpty`` above the limit."""
    if not outputs:
        return 0.0
    empty = sum(is_empty_output(o) for o in outputs)
    frac = empty / len(outputs)
    if frac > max_empty_fraction:
        raise ExtractionMostlyEmpty(
            f"stage {stage!r}: {empty}/{len(outputs)} outputs ({frac:.0%}) are empty or invalid, "
            f"above the allowed {max_empty_fraction:.0%}. Check the model, prompt and json_mode "
            f"settings before building anything from this output."
        )
    return frac


# --------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------
class _Transient(Exception):
    """Internal: a retryable failure, with an optional server-requested wait."""

    def __init__(self, reason: str, retry_after: float | None = None, malformed: bool = False) -> None:
        super().__init__(reason)
        self.retry_after = retry_after
        self.malformed = malformed


def _retry_after_seconds(headers: Any) -> float | None:
    """Seconds from ``Retry-After`` / ``retry-after-ms`` headers, if parseable."""
    if headers is None:
        return None
    try:
        if (ms := headers.get("retry-after-ms")) is not None:
            return max(0.0, float(ms) / 1000.0)
        if (secs := headers.get("retry-after")) is not None:
            return max(0.0, float(secs))
    except (TypeError, ValueError):
        return None  # HTTP-date form or junk: fall back to backoff
    return None


def _resolve_api_key(params: LLMParams) -> str:
    """API key from the env var named in params ('local' may run keyless)."""
    key = os.environ.get(params.api_key_env, "") if params.api_key_env else ""
    if key:
        return key
    if params.provider == "openai":
        raise LLMConfigError(
            f"llm.provider=openai needs an API key: set llm.api_key_env to the name of an "
            f"environment variable and export it (currently api_key_env={params.api_key_env!r}, "
            f"which is unset or empty)."
        )
    return "EMPTY"  # local OpenAI-compatible servers usually ignore the key


class LLMClient:
    """OpenAI-compatible chat client with retries, cache, ledger and JSON outputs.

    Cache reads/writes and ledger updates happen on the calling thread only;
    worker threads just perform HTTP requests.
    """

    def __init__(self, params: LLMParams, cache_path: str | Path | None) -> None:
        """``cache_path``: DuckDB file for the response cache (None disables it)."""
        from openai import OpenAI  # imported lazily so provider=none needs no openai

        if params.provider == "none":
            raise LLMConfigError("LLMClient needs provider 'openai' or 'local'; use make_client() for 'none'")
        self.params = params
        self.base_url = params.base_url or "https://api.openai.com/v1"
        if params.provider == "local" and not params.base_url:
            raise LLMConfigError("llm.provider=local needs llm.base_url (e.g. http://127.0.0.1:8000/v1)")
        if not params.model:
            raise LLMConfigError("llm.model must be set")
        self.cache = ResponseCache(cache_path) if cache_path is not None else None
        self._openai = OpenAI(api_key=_resolve_api_key(params), base_url=self.base_url,
                              timeout=params.timeout_s, max_retries=0)
        self._rng = random.Random()
        self._ledger: list[LedgerEntry] = []
        self._json_failures: dict[str, int] = {}
        self._json_repairs: dict[str, int] = {}
        self._wall: dict[str, float] = {}
        self._ledger_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"LLMClient(provider={self.params.provider!r}, model={self.params.model!r}, base_url={self.base_url!r})"

    # ---- sampling / keys ----------------------------------------------------
    def sampling(self, **overrides: Any) -> dict[str, Any]:
        """Effective sampling params (defaults from params, then ``overrides``)."""
        unknown = set(overrides) - set(SAMPLING_KEYS)
        if unknown:
            raise TypeError(f"unknown sampling params {sorted(unknown)}; allowed: {SAMPLING_KEYS}")
        base = {"temperature": self.params.temperature, "max_tokens": self.params.max_tokens,
                "seed": self.params.seed, "response_format": None}
        return {**base, **overrides}

    def key_for(self, messages: Sequence[Message], **sampling: Any) -> str:
        """Cache key of a request."""
        return cache_key(self.params.model, messages, self.sampling(**sampling))

    # ---- single HTTP request with retries (worker threads) -------------------
    def _request_once(self, messages: Sequence[Message], sampling: dict[str, Any]) -> tuple[str, int, int]:
        """One HTTP call; maps transient failures to ``_Transient``."""
        import openai

        kwargs: dict[str, Any] = {"model": self.params.model, "messages": list(messages),
                                  "temperature": sampling["temperature"],
                                  "max_tokens": sampling["max_tokens"], "seed": sampling["seed"]}
        if sampling.get("response_format"):
            kwargs["response_format"] = sampling["response_format"]
        try:
            resp = self._openai.chat.completions.create(**kwargs)
        except openai.APITimeoutError as exc:
            raise _Transient(f"timeout after {self.params.timeout_s}s") from exc
        except openai.APIConnectionError as exc:
            raise _Transient(f"connection error ({exc.__cause__ or exc})") from exc
        except openai.APIStatusError as exc:
            raise self._status_error(exc) from exc
        except ValueError as exc:  # body is not JSON
            raise _Transient(f"malformed response body ({exc})", malformed=True) from exc
        return self._unpack(resp, messages)

    def _status_error(self, exc: Any) -> Exception:
        """Classify an HTTP error status as transient or fatal."""
        status = int(exc.status_code)
        if status in (408, 409, 429) or status >= 500:
            return _Transient(f"HTTP {status}", retry_after=_retry_after_seconds(exc.response.headers))
        hint = {401: f"check the API key in env var {self.params.api_key_env!r}",
                403: "the key lacks permission for this model/endpoint",
                404: f"check llm.base_url and llm.model ({self.params.model!r})",
                400: "the server rejected a parameter; if it is response_format, set llm.json_mode=false"}
        return LLMRequestError(f"LLM endpoint {self.base_url} rejected the request with HTTP {status}: "
                               f"{_short(str(exc))}. Fix: {hint.get(status, 'check the request parameters')}.")

    def _unpack(self, resp: Any, messages: Sequence[Message]) -> tuple[str, int, int]:
        """(text, prompt_tokens, completion_tokens); estimates usage when absent."""
        choices = getattr(resp, "choices", None)
        if not choices or getattr(choices[0], "message", None) is None:
            raise _Transient("response has no choices", malformed=True)
        text = choices[0].message.content or ""
        usage = getattr(resp, "usage", None)
        pt = getattr(usage, "prompt_tokens", None) if usage is not None else None
        ct = getattr(usage, "completion_tokens", None) if usage is not None else None
        return (text, int(pt) if pt is not None else estimate_tokens(messages),
                int(ct) if ct is not None else estimate_text_tokens(text))

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        """Wait before retry ``attempt`` (0-based): Retry-After or jittered exponential."""
        cap = self.params.backoff_max_s
        if retry_after is not None:
            return min(retry_after, cap) + self._rng.uniform(0.0, 0.1 * self.params.backoff_base_s)
        expo = min(cap, self.params.backoff_base_s * (2 ** attempt))
        return self._rng.uniform(0.5 * expo, expo)

    def _request(self, messages: Sequence[Message], sampling: dict[str, Any],
                 abort: threading.Event | None = None) -> tuple[str, int, int, float]:
        """HTTP call with retries; returns (text, pt, ct, seconds incl. waits).

        Setting ``abort`` (another request of the batch failed) stops retrying.
        """
        abort = abort or threading.Event()
        t0 = time.perf_counter()
        last: _Transient | None = None
        for attempt in range(self.params.max_retries + 1):
            try:
                return (*self._request_once(messages, sampling), time.perf_counter() - t0)
            except _Transient as exc:
                last = exc
                if attempt < self.params.max_retries:
                    delay = self._backoff(attempt, exc.retry_after)
                    log.warning("LLM %s: %s; retry %d/%d in %.2fs", self.base_url, exc,
                                attempt + 1, self.params.max_retries, delay)
                    if abort.wait(delay):
                        break
        raise self._exhausted(last)

    def _exhausted(self, last: _Transient | None) -> LLMError:
        """The error raised once retries are used up."""
        tries = self.params.max_retries + 1
        if last is not None and last.malformed:
            return LLMBadResponse(f"LLM endpoint {self.base_url} returned malformed responses "
                                  f"{tries} times (last: {last}). Fix: check that llm.base_url points "
                                  f"at an OpenAI-compatible /v1 chat-completions API.")
        return LLMUnreachable(
            f"LLM endpoint {self.base_url} (model {self.params.model!r}) failed {tries} attempts "
            f"(last error: {last}). Fix: start the server / check llm.base_url, network and rate "
            f"limits, or raise llm.timeout_s / llm.max_retries; use llm.provider=none to skip LLM stages."
        )

    # ---- public chat API -------------------------------------------------
    def chat(self, messages: Messages, stage: str = "chat", **sampling: Any) -> LLMResult:
        """One chat completion (cached)."""
        return self.chat_many([messages], stage=stage, **sampling)[0]

    def chat_many(self, list_of_messages: Sequence[Messages], stage: str, **sampling: Any) -> list[LLMResult]:
        """Chat completions for many conversations, order preserved.

        Cache hits cost no HTTP; misses run on a pool of ``concurrency`` threads.
        Finished results are written to the cache even if a later one fails.
        """
        t0 = time.perf_counter()
        samp = self.sampling(**sampling)
        keys = [cache_key(self.params.model, m, samp) for m in list_of_messages]
        hits = self.cache.get_many(keys) if self.cache is not None else {}
        results: dict[str, LLMResult] = {k: LLMResult(*hits[k], cached=True, seconds=0.0) for k in hits}
        todo = {k: m for k, m in zip(keys, list_of_messages) if k not in results}
        try:
            self._run_pool(todo, samp, stage, results)
        finally:
            self._record(stage, keys, results, hits, time.perf_counter() - t0)
        return [results[k] for k in keys]

    def _run_pool(self, todo: dict[str, Messages], samp: dict[str, Any], stage: str,
                  results: dict[str, LLMResult]) -> None:
        """Run uncached requests concurrently into ``results``; cache whatever finished.

        On the first failure, queued requests are cancelled, running ones stop
        retrying, finished ones are still cached, then the error is raised.
        """
        if not todo:
            return
        fresh: dict[str, LLMResult] = {}
        abort = threading.Event()
        pool = ThreadPoolExecutor(max_workers=min(self.params.concurrency, len(todo)),
                                  thread_name_prefix=f"llm-{stage}")
        try:
            futures: dict[Future[tuple[str, int, int, float]], str] = {
                pool.submit(self._request, m, samp, abort): k for k, m in todo.items()}
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if f.exception() is not None]
            if failed:
                abort.set()
                pool.shutdown(wait=True, cancel_futures=True)
            for fut, key in futures.items():
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    text, pt, ct, secs = fut.result()
                    fresh[key] = LLMResult(text, pt, ct, cached=False, seconds=secs)
            if self.cache is not None:
                self.cache.put_many({k: (r.text, r.prompt_tokens, r.completion_tokens)
                                     for k, r in fresh.items()}, self.params.model)
            results.update(fresh)
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
        finally:
            abort.set()
            pool.shutdown(wait=True, cancel_futures=True)

    # ---- ledger ------------------------------------------------------------
    def _record(self, stage: str, keys: list[str], results: dict[str, LLMResult],
                hits: dict[str, CachedRow], wall: float) -> None:
        """Add one ledger entry per request that produced a result.

        Repeated identical requests within a batch are served once; the
        repeats count as cache hits.
        """
        entries: list[LedgerEntry] = []
        seen: set[str] = set()
        for k in keys:
            if k not in results:
                continue
            if k in hits or k in seen:
                entries.append(LedgerEntry(stage, 0, 0, 0.0, True))
            else:
                r = results[k]
                entries.append(LedgerEntry(stage, r.prompt_tokens, r.completion_tokens, r.seconds, False))
            seen.add(k)
        with self._ledger_lock:
            self._ledger.extend(entries)
            self._wall[stage] = self._wall.get(stage, 0.0) + wall
        n_hit = sum(e.cache_hit for e in entries)
        log.info("LLM stage %s: %d requests, %d cache hits, %d prompt + %d completion tokens, %.1fs",
                 stage, len(keys), n_hit, sum(e.prompt_tokens for e in entries),
                 sum(e.completion_tokens for e in entries), wall)

    def ledger_entries(self, stage: str | None = None) -> list[LedgerEntry]:
        """Copy of the ledger, optionally for one stage."""
        with self._ledger_lock:
            return [e for e in self._ledger if stage is None or e.stage == stage]

    def ledger_summary(self, stage: str | None = None) -> dict[str, Any]:
        """Totals: prompt/completion tokens and seconds (fresh calls only),
        ``llm_calls`` (HTTP-served requests), ``llm_cache_hits``, ``json_failures``,
        ``json_repairs`` and ``wall_seconds`` (elapsed time in chat calls)."""
        entries = self.ledger_entries(stage)
        with self._ledger_lock:
            pick = (lambda d: sum(d.values())) if stage is None else (lambda d: d.get(stage, 0))
            failures, repairs, wall = pick(self._json_failures), pick(self._json_repairs), pick(self._wall)
        fresh = [e for e in entries if not e.cache_hit]
        return {"prompt_tokens": sum(e.prompt_tokens for e in fresh),
                "completion_tokens": sum(e.completion_tokens for e in fresh),
                "llm_calls": len(fresh), "llm_cache_hits": len(entries) - len(fresh),
                "seconds": round(sum(e.seconds for e in fresh), 3),
                "wall_seconds": round(float(wall), 3),
                "json_failures": int(failures), "json_repairs": int(repairs)}

    # ---- estimates ----------------------------------------------------------
    def dry_run_estimate(self, list_of_messages: Sequence[Messages], expected_completion_tokens: int,
                         **sampling: Any) -> dict[str, int]:
        """Estimated cost of running ``list_of_messages`` now (cache misses only)."""
        samp = self.sampling(**sampling)
        keys = [cache_key(self.params.model, m, samp) for m in list_of_messages]
        hits = self.cache.get_many(keys) if self.cache is not None else {}
        misses = {k: m for k, m in zip(keys, list_of_messages) if k not in hits}
        return {"calls": len(misses),
                "prompt_tokens": sum(estimate_tokens(m) for m in misses.values()),
                "completion_tokens": len(misses) * int(expected_completion_tokens)}

    # ---- structured outputs -----------------------------------------------
    def chat_json(self, messages_list: Sequence[Messages], schema: dict[str, Any], stage: str,
                  json_mode: bool | None = None, **sampling: Any) -> list[Any]:
        """Schema-validated JSON replies (None where invalid after one repair).

        ``json_mode`` (default ``params.json_mode``) sends
        ``response_format={"type": "json_object"}``. Each invalid reply gets one
        repair round that quotes the validation error; remaining failures are
        counted as ``json_failures`` for ``stage``.
        """
        use_fmt = self.params.json_mode if json_mode is None else json_mode
        if use_fmt:
            sampling = {**sampling, "response_format": JSON_FORMAT}
        first = self.chat_many(messages_list, stage=stage, **sampling)
        out: list[Any] = [None] * len(first)
        repairs: list[tuple[int, Messages]] = []
        for i, (res, msgs) in enumerate(zip(first, messages_list)):
            value, err = _parse_and_validate(res.text, schema)
            if err is None:
                out[i] = value
            else:
                repairs.append((i, repair_messages(msgs, res.text, err, schema)))
        failures = self._repair(out, repairs, schema, stage, sampling)
        with self._ledger_lock:
            self._json_repairs[stage] = self._json_repairs.get(stage, 0) + len(repairs)
            self._json_failures[stage] = self._json_failures.get(stage, 0) + failures
        if failures:
            log.warning("LLM stage %s: %d/%d structured replies invalid after repair",
                        stage, failures, len(out))
        return out

    def _repair(self, out: list[Any], repairs: list[tuple[int, Messages]], schema: dict[str, Any],
                stage: str, sampling: dict[str, Any]) -> int:
        """Run the repair round in place; return the number of final failures."""
        if not repairs:
            return 0
        second = self.chat_many([m for _, m in repairs], stage=stage, **sampling)
        failures = 0
        for (i, _), res in zip(repairs, second):
            value, err = _parse_and_validate(res.text, schema)
            out[i] = value if err is None else None
            failures += err is not None
        return failures


def _short(text: str, limit: int = 300) -> str:
    """Truncate server error text for messages."""
    return text if len(text) <= limit else text[:limit] + "..."


def make_client(params: LLMParams, cache_path: str | Path | None) -> LLMClient | None:
    """An ``LLMClient``, or None (with one log line) when ``provider == 'none'``."""
    if params.provider == "none":
        log.info("llm.provider=none: skipping LLM stages (set llm.provider to 'openai' or 'local' to enable)")
        return None
    return LLMClient(params, cache_path)
