"""One chat-completion HTTP request, with retries: the only code that talks to the endpoint.

:class:`Transport` wraps a sync ``openai.OpenAI`` client (its own retries disabled) and adds
per-request timeouts and retries with exponential backoff + jitter on 429/5xx, connection
errors, timeouts and malformed bodies (``Retry-After`` honoured). Non-retryable 4xx statuses
fail at once with a hint on what to fix.

The API key is read from the environment variable named by ``LLMParams.api_key_env`` at
construction and handed only to the ``openai`` client: it is never logged, cached, or part of
a cache key.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from typing import Any, Sequence

from tasks.llm.ledger import estimate_text_tokens, estimate_tokens
from tasks.llm.params import (
    LLMBadResponse,
    LLMConfigError,
    LLMError,
    LLMParams,
    LLMRequestError,
    LLMUnreachable,
    Message,
)

log = logging.getLogger(__name__)


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


def _short(text: str, limit: int = 300) -> str:
    """Truncate server error text for messages."""
    return text if len(text) <= limit else text[:limit] + "..."


class Transport:
    """Chat-completion requests against one OpenAI-compatible endpoint, retried on transient failures.

    Safe to call from worker threads: each call is independent (the jitter RNG is the only shared state).
    """

    def __init__(self, params: LLMParams, base_url: str) -> None:
        from openai import OpenAI  # imported lazily so provider=none needs no openai

        self.params = params
        self.base_url = base_url
        self._openai = OpenAI(api_key=_resolve_api_key(params), base_url=base_url,
                              timeout=params.timeout_s, max_retries=0)
        self._rng = random.Random()

    def request(self, messages: Sequence[Message], sampling: dict[str, Any],
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

    @staticmethod
    def _unpack(resp: Any, messages: Sequence[Message]) -> tuple[str, int, int]:
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

    def __repr__(self) -> str:
        return f"Transport(model={self.params.model!r}, base_url={self.base_url!r})"
