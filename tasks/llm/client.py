"""LLM access layer: an OpenAI-compatible chat client with a response cache.

The layer, module by module (all pure library code; flows wire them in):

* :mod:`tasks.llm.params` — :class:`LLMParams` (frozen config, mirrors the Hydra ``llm``
  group), the errors (incl. ``LLMDryRun``, ``ExtractionMostlyEmpty``) and value types.
* :mod:`tasks.llm.cache` — :func:`cache_key` and the DuckDB :class:`ResponseCache`.
* :mod:`tasks.llm.ledger` — token estimates and the per-stage token :class:`Ledger`.
* :mod:`tasks.llm.schema` — JSON parsing, schema validation, the repair round, empty-output checks.
* :mod:`tasks.llm.transport` — one HTTP request with timeouts, retries and backoff.
* this module — :class:`LLMClient`: cache lookups, bounded thread-pool concurrency over the
  transport, the ledger, structured JSON outputs; :func:`make_client` returns ``None`` for
  ``provider="none"`` so callers can skip LLM work.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Collection, Iterator, Sequence

from tasks.core.progress import progress_bar
from tasks.llm.cache import SAMPLING_KEYS, ResponseCache, cache_key
from tasks.llm.ledger import Ledger, LedgerEntry, estimate_tokens
from tasks.llm.params import LLMConfigError, LLMParams, LLMResult, Message, Messages
from tasks.llm.schema import JSON_FORMAT, structured_replies
from tasks.llm.transport import Transport

log = logging.getLogger(__name__)


class LLMClient:
    """OpenAI-compatible chat client with retries, cache, ledger and JSON outputs.

    Cache reads/writes and ledger updates happen on the calling thread only;
    worker threads just perform HTTP requests.
    """

    def __init__(self, params: LLMParams, cache_path: str | Path | None) -> None:
        """``cache_path``: DuckDB file for the response cache (None disables it)."""
        if params.provider == "none":
            raise LLMConfigError("LLMClient needs provider 'openai' or 'local'; use make_client() for 'none'")
        self.params = params
        self.base_url = params.base_url or "https://api.openai.com/v1"
        if params.provider == "local" and not params.base_url:
            raise LLMConfigError("llm.provider=local needs llm.base_url (e.g. http://127.0.0.1:8000/v1)")
        if not params.model:
            raise LLMConfigError("llm.model must be set")
        self.cache = ResponseCache(cache_path) if cache_path is not None else None
        self.transport = Transport(params, self.base_url)
        self.ledger = Ledger()

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
        errors: list[BaseException] = []
        try:
            self._run_pool(todo, samp, stage, results, errors)
        finally:
            self.ledger.record(stage, keys, results, hits, time.perf_counter() - t0, failed=len(errors))
        return [results[k] for k in keys]

    def _run_pool(self, todo: dict[str, Messages], samp: dict[str, Any], stage: str,
                  results: dict[str, LLMResult], errors: list[BaseException]) -> None:
        """Run uncached requests concurrently into ``results``; cache whatever finished.

        On the first failure, queued requests are cancelled, running ones stop
        retrying, finished ones are still cached, then the error is raised. Every
        request that ended in an error is appended to ``errors`` (for the ledger).
        """
        if not todo:
            return
        fresh: dict[str, LLMResult] = {}
        abort = threading.Event()
        pool = ThreadPoolExecutor(max_workers=min(self.params.concurrency, len(todo)),
                                  thread_name_prefix=f"llm-{stage}")
        try:
            futures: dict[Future[tuple[str, int, int, float]], str] = {
                pool.submit(self.transport.request, m, samp, abort): k for k, m in todo.items()}
            watch(futures, f"llm {stage}")
            failed = [f for f in futures if f.done() and f.exception() is not None]
            if failed:
                abort.set()
                pool.shutdown(wait=True, cancel_futures=True)
            for fut, key in futures.items():
                if fut.done() and not fut.cancelled() and fut.exception() is not None:
                    errors.append(fut.exception())  # type: ignore[arg-type]
                elif fut.done() and not fut.cancelled():
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
    def ledger_entries(self, stage: str | None = None) -> list[LedgerEntry]:
        """Copy of the ledger, optionally for one stage."""
        return self.ledger.entries(stage)

    def ledger_summary(self, stage: str | None = None) -> dict[str, Any]:
        """Totals of the ledger (all stages, or one): see :meth:`Ledger.summary`."""
        return self.ledger.summary(stage)

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

        def ask(conversations: Sequence[Messages]) -> list[str]:
            return [r.text for r in self.chat_many(conversations, stage=stage, **sampling)]

        out = structured_replies(ask, messages_list, schema)
        self.ledger.count_json(stage, out.repairs, out.failures)
        if out.failures:
            log.warning("LLM stage %s: %d/%d structured replies invalid after repair",
                        stage, out.failures, len(out.values))
        return out.values


def watch(futures: Collection[Future[tuple[str, int, int, float]]], desc: str) -> None:
    """Wait until every request is answered or one fails, counting answers and tokens on a progress bar."""
    prompt = completion = 0
    with progress_bar(len(futures), desc, unit="call") as bar:
        for fut in as_completed(futures):
            if fut.exception() is not None:
                return
            _, pt, ct, _ = fut.result()
            prompt, completion = prompt + pt, completion + ct
            bar.set_postfix_str(f"{prompt} prompt + {completion} completion tokens", refresh=False)
            bar.update(1)


def make_client(params: LLMParams, cache_path: str | Path | None) -> LLMClient | None:
    """An ``LLMClient``, or None (with one log line) when ``provider == 'none'``."""
    if params.provider == "none":
        log.info("llm.provider=none: skipping LLM stages (set llm.provider to 'openai' or 'local' to enable)")
        return None
    return LLMClient(params, cache_path)


@contextmanager
def ledger_rows(store: Any, run_id: str, client: LLMClient | None, *stages: str) -> Iterator[None]:
    """Write ``client``'s ledger rows of ``stages`` into the catalog (``store.record_ledger``) when the block
    ends, also when it fails: a failed index stage's calls, failed requests included, are still counted."""
    try:
        yield
    finally:
        if client is not None:
            for stage in stages:
                store.record_ledger(run_id, stage, client.ledger_summary(stage))
