"""The LLM response cache: content keys of requests and a DuckDB table of replies.

:func:`cache_key` hashes (model, messages, sampling params); the API key and transport settings
(base URL, timeouts, concurrency) are never part of it. :class:`ResponseCache` keeps the replies
in a DuckDB file with short-lived connections, guarded by ``fcntl.flock`` on ``<path>.lock``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb

from tasks.llm.params import Message

SAMPLING_KEYS = ("temperature", "max_tokens", "seed", "response_format")
CACHE_KEY_VERSION = 1

CachedRow = tuple[str, int, int]  # (text, prompt_tokens, completion_tokens)


def cache_key(model: str, messages: Sequence[Message], sampling: dict[str, Any]) -> str:
    """sha256 of canonical JSON of (model, messages, sampling params)."""
    payload = {"v": CACHE_KEY_VERSION, "model": model, "messages": list(messages),
               "sampling": {k: sampling.get(k) for k in SAMPLING_KEYS}}
    canon = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


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
