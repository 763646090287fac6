"""Token estimates and the token ledger: what every LLM stage asked for and what it cost.

Token estimates (:func:`estimate_tokens`) use the common ~4 characters per token heuristic for
English text plus a few tokens of per-message overhead; they are meant for budgeting, not billing.

:class:`Ledger` is owned by one client: one :class:`LedgerEntry` per request that produced a
result (cache hits have zero tokens), per-stage wall time, per-stage counts of requests that
failed (the endpoint kept failing, or rejected them) and of structured replies that needed a repair
round or stayed invalid. :meth:`Ledger.summary` is the row
``Store.record_ledger`` writes.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from typing import Any, Container, Mapping, Sequence

from tasks.llm.params import LLMResult, Message

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4


# --------------------------------------------------------------------------
# Token estimates
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


# --------------------------------------------------------------------------
# Ledger
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class LedgerEntry:
    """One request as seen by the ledger (cache hits have zero tokens)."""

    stage: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    cache_hit: bool


class Ledger:
    """Thread-safe per-stage bookkeeping of one client's requests."""

    def __init__(self) -> None:
        self._entries: list[LedgerEntry] = []
        self._json_failures: dict[str, int] = {}
        self._json_repairs: dict[str, int] = {}
        self._failed: dict[str, int] = {}
        self._wall: dict[str, float] = {}
        self._lock = threading.Lock()

    def record(self, stage: str, keys: Sequence[str], results: Mapping[str, LLMResult],
               hits: Container[str], wall: float, failed: int = 0) -> None:
        """Add one entry per request (by cache key, in ``keys`` order) that produced a result.

        ``hits`` are the keys served from the cache. Repeated identical requests within a batch
        are served once; the repeats count as cache hits. ``failed``: requests of the batch that
        ended in an error (requests cancelled before they were sent are not counted).
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
        with self._lock:
            self._entries.extend(entries)
            self._wall[stage] = self._wall.get(stage, 0.0) + wall
            self._failed[stage] = self._failed.get(stage, 0) + failed
        n_hit = sum(e.cache_hit for e in entries)
        log.info("LLM stage %s: %d requests, %d cache hits, %d failed, %d prompt + %d completion tokens, %.1fs",
                 stage, len(keys), n_hit, failed, sum(e.prompt_tokens for e in entries),
                 sum(e.completion_tokens for e in entries), wall)

    def count_json(self, stage: str, repairs: int, failures: int) -> None:
        """Add a structured-output batch's repair rounds and final failures to ``stage``."""
        with self._lock:
            self._json_repairs[stage] = self._json_repairs.get(stage, 0) + repairs
            self._json_failures[stage] = self._json_failures.get(stage, 0) + failures

    def stages(self) -> list[str]:
        """Every stage with a request in the ledger, answered or failed."""
        with self._lock:
            return sorted({e.stage for e in self._entries} | {s for s, n in self._failed.items() if n})

    def entries(self, stage: str | None = None) -> list[LedgerEntry]:
        """Copy of the entries, optionally for one stage."""
        with self._lock:
            return [e for e in self._entries if stage is None or e.stage == stage]

    def summary(self, stage: str | None = None) -> dict[str, Any]:
        """Totals: prompt/completion tokens and seconds (fresh calls only),
        ``llm_calls`` (HTTP-served requests), ``llm_cache_hits``, ``llm_failed`` (requests that
        ended in an error), ``json_failures``, ``json_repairs`` and ``wall_seconds`` (elapsed
        time in chat calls)."""
        entries = self.entries(stage)
        with self._lock:
            pick = (lambda d: sum(d.values())) if stage is None else (lambda d: d.get(stage, 0))
            failures, repairs, wall = pick(self._json_failures), pick(self._json_repairs), pick(self._wall)
            failed = pick(self._failed)
        fresh = [e for e in entries if not e.cache_hit]
        return {"prompt_tokens": sum(e.prompt_tokens for e in fresh),
                "completion_tokens": sum(e.completion_tokens for e in fresh),
                "llm_calls": len(fresh), "llm_cache_hits": len(entries) - len(fresh), "llm_failed": int(failed),
                "seconds": round(sum(e.seconds for e in fresh), 3),
                "wall_seconds": round(float(wall), 3),
                "json_failures": int(failures), "json_repairs": int(repairs)}
