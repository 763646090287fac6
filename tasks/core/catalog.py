"""The catalog: ``catalog.duckdb`` under ``artifacts_dir``, which records every stage output, run, event, metric and
row-cache part, with the sessions that read and write it.

The catalog is opened only for short, file-locked transactions (:meth:`Catalog.catalog`), so two processes sharing
one ``artifacts_dir`` queue behind each other instead of corrupting it. A catalog written under another root (the
folder was moved or copied) is rewritten to name the files under this one on its first session.
"""
from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import logging
import os
import signal
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import duckdb
import pandas as pd

from tasks.core.files import (
    CATALOG,
    CATALOG_LOCK,
    DISK_ERRORS,
    StoreError,
    disk_error,
    file_digest,
    file_problem,
    first_line,
)
from tasks.core.hashing import json_default

log = logging.getLogger("dagrag")

LOCK_TIMEOUT_S = 120.0
# DuckDB's own file lock on the catalog can be held by a program outside dagrag's file lock (a
# `duckdb` shell, a notebook): opening it is retried with backoff for this long before giving up.
CATALOG_OPEN_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS stages (
  stage VARCHAR, name VARCHAR, fp VARCHAR, dataset VARCHAR, path VARCHAR,
  input_fps JSON, params JSON, rows BIGINT, rows_computed BIGINT,
  seconds DOUBLE, peak_rss_mb DOUBLE, created_at TIMESTAMP, run_id VARCHAR);
CREATE TABLE IF NOT EXISTS stage_events (
  run_id VARCHAR, stage VARCHAR, fp VARCHAR, dataset VARCHAR, status VARCHAR,
  rows BIGINT, rows_computed BIGINT, seconds DOUBLE, peak_rss_mb DOUBLE, created_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS runs (
  run_id VARCHAR, command VARCHAR, started_at TIMESTAMP, manifest JSON);
ALTER TABLE runs ADD COLUMN IF NOT EXISTS status VARCHAR;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS ended_at TIMESTAMP;
CREATE TABLE IF NOT EXISTS llm_ledger (
  run_id VARCHAR, stage VARCHAR, llm_calls BIGINT, llm_cache_hits BIGINT, prompt_tokens BIGINT,
  completion_tokens BIGINT, seconds DOUBLE, created_at TIMESTAMP);
ALTER TABLE llm_ledger ADD COLUMN IF NOT EXISTS llm_failed BIGINT;
CREATE TABLE IF NOT EXISTS metrics (
  run_id VARCHAR, kind VARCHAR, method VARCHAR, dataset VARCHAR, created_at TIMESTAMP, metrics JSON);
ALTER TABLE metrics ADD COLUMN IF NOT EXISTS overrides JSON;
CREATE TABLE IF NOT EXISTS store_root (root VARCHAR);
ALTER TABLE stages ADD COLUMN IF NOT EXISTS bytes BIGINT;
ALTER TABLE stages ADD COLUMN IF NOT EXISTS digest VARCHAR;
CREATE TABLE IF NOT EXISTS row_parts (path VARCHAR, bytes BIGINT, digest VARCHAR, created_at TIMESTAMP);
ALTER TABLE stages ADD COLUMN IF NOT EXISTS outputs JSON;
"""
# The fault hook of the kill-anywhere tests (tests/faults/test_kill_anywhere.py), not a setting: where this variable
# holds N, the process SIGKILLs itself just before its Nth catalog write statement (COMMIT included; counted from
# its start), so a test can stop a real command at every write of a stage record, not only where timing lands.
FAULT_KILL_AT_WRITE = "DAGRAG_FAULT_KILL_AT_WRITE"
# ... and where this one names a file, each write statement is appended to it as "N<TAB>statement" (the points a
# test may kill at)
FAULT_TRACE = "DAGRAG_FAULT_TRACE"
_writes = 0
# how the fix for a catalog that cannot be read is worded, wherever that is found
REBUILD_HINT = "run `dagrag doctor doctor.repair=true artifacts_dir={root}` to rebuild it from the files it can verify"
# what DuckDB says of a damaged database file (a truncated one, a failed block checksum, a foreign file)
_DAMAGED_CATALOG = ("could not read enough bytes", "corrupt database", "checksum", "not a valid duckdb",
                    "invalid database", "failed to read database header")


def fault_point(sql: str = "COMMIT") -> None:
    """Count one catalog write statement; SIGKILL this process at the one :data:`FAULT_KILL_AT_WRITE` names, and
    trace it where :data:`FAULT_TRACE` asks (both unset outside the fault tests: nothing happens)."""
    global _writes
    at, trace = os.environ.get(FAULT_KILL_AT_WRITE), os.environ.get(FAULT_TRACE)
    if not (at or trace):
        return
    _writes += 1
    if trace:
        with open(trace, "a") as fh:
            fh.write(f"{_writes}\t{' '.join(sql.split())[:60]}\n")
    if at and _writes == int(at):
        os.kill(os.getpid(), signal.SIGKILL)


class _Writer:
    """The connection of a write transaction (:meth:`Catalog.writing`): each statement passes the fault hook."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self._con = con

    def execute(self, sql: str, params: Any = None) -> duckdb.DuckDBPyConnection:
        fault_point(sql)
        return self._con.execute(sql, params) if params is not None else self._con.execute(sql)

    def executemany(self, sql: str, params: Any) -> duckdb.DuckDBPyConnection:
        fault_point(sql)
        return self._con.executemany(sql, params)


class CatalogDamaged(StoreError):
    """The catalog cannot be read; ``reason`` is what DuckDB said."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# ----------------------------------------------------------------------------- the DuckDB host and its sessions

# This process's in-memory DuckDB, which the catalog file is attached to for each catalog session. Opening a
# DuckDB file starts a new database instance every time (20-45 ms here, whatever the file's size), and a run
# opens the catalog two or three times per stage; attaching the file to an instance that lives as long as the
# process costs 3-7 ms, and detaching it releases the file and its lock as closing does. Sessions take turns on
# it (they already queue on the catalog's file lock), and it is closed before a fork(): an instance copied into
# a child cannot even be freed there (DuckDB crashes), so a child starts its own.
_HOST_LOCK = threading.RLock()
_host_con: duckdb.DuckDBPyConnection | None = None


def _host() -> duckdb.DuckDBPyConnection:
    global _host_con
    if _host_con is None:
        _host_con = duckdb.connect(":memory:")
    return _host_con


def _drop_host() -> None:
    """Close the host, and with it every file still attached to it."""
    global _host_con
    host, _host_con = _host_con, None
    if host is not None:
        host.close()


def _before_fork() -> None:
    _HOST_LOCK.acquire()  # no session is half-way when the process is copied
    _drop_host()


os.register_at_fork(before=_before_fork, after_in_parent=_HOST_LOCK.release, after_in_child=_HOST_LOCK.release)


def _catalog_alias(path: Path) -> str:
    return "dagrag_catalog_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]


def _attach(path: Path, alias: str) -> duckdb.DuckDBPyConnection:
    """A cursor on the host with the catalog at ``path`` attached as ``alias`` and in use."""
    cur = _host().cursor()
    try:
        quoted = str(path).replace("'", "''")
        cur.execute(f"ATTACH '{quoted}' AS {alias}")
    except BaseException:
        cur.close()
        raise
    try:
        cur.execute(f"USE {alias}")
    except BaseException:
        _detach(cur, alias)
        raise
    return cur


def _detach(cur: duckdb.DuckDBPyConnection, alias: str) -> None:
    """End a catalog session: the file detached (its lock released) whatever state the session left."""
    try:
        cur.execute("USE memory")
        cur.execute(f"DETACH {alias}")
    except duckdb.Error:  # e.g. a transaction left open: closing the host detaches the file all the same
        _drop_host()
    finally:
        cur.close()


def _connect_catalog(path: Path, alias: str) -> duckdb.DuckDBPyConnection:
    """Attach the catalog, retrying with backoff while another program holds DuckDB's lock on it.

    dagrag's own processes never collide here (they queue on the catalog's file lock first); a
    `duckdb` shell or notebook with the file open does, and is given ``CATALOG_OPEN_TIMEOUT_S``.
    """
    deadline = time.monotonic() + CATALOG_OPEN_TIMEOUT_S
    delay = 0.05
    while True:
        try:
            return _attach(path, alias)
        except duckdb.IOException as err:
            if "lock" not in str(err).lower():
                raise catalog_error(path, err) or StoreError(f"cannot open the catalog {path}: {err}") from None
            if time.monotonic() + delay > deadline:
                raise StoreError(f"the catalog {path} has been held by another program for "
                                 f"{CATALOG_OPEN_TIMEOUT_S:.0f} s (close it, e.g. a duckdb shell): {err}") from err
            time.sleep(delay)
            delay = min(2 * delay, 1.0)


def catalog_error(path: Path, err: duckdb.Error) -> StoreError | None:
    """The one-line :class:`StoreError` for a catalog that DuckDB found damaged, or could not write for a disk
    condition; None for any other DuckDB error."""
    text = first_line(err)
    low = text.lower()
    for code, (what, fix) in DISK_ERRORS.items():
        if os.strerror(code).lower() in low:
            return StoreError(f"{what} writing the catalog {path}: {fix}")
    if any(sign in low for sign in _DAMAGED_CATALOG):
        return CatalogDamaged(f"the catalog {path} is damaged ({text}): {REBUILD_HINT.format(root=path.parent)}",
                              text)
    return None


def _written_root(con: duckdb.DuckDBPyConnection) -> str | None:
    """The root a catalog without ``store_root`` was written under, read off its stage rows' paths
    (:meth:`Store.path_for`: ``<root>/<dataset>/<stage>/<file>``) if they all agree; else None."""
    roots = {str(path.parents[2]) for dataset, stage, path in
             ((d, s, Path(p)) for d, s, p in con.execute("SELECT dataset, stage, path FROM stages").fetchall())
             if path.parent.name == stage and path.parent.parent.name == dataset}
    return roots.pop() if len(roots) == 1 else None


class Catalog:
    """Sessions on the catalog of the ``artifacts_dir`` ``root``, and the records a run writes into it."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.root / CATALOG_LOCK
        self._catalog_path = self.root / CATALOG
        self._catalog_alias = _catalog_alias(self._catalog_path)  # its name while attached to the host
        self._root_followed = False  # whether this object's first catalog session checked the recorded root

    @contextmanager
    def _catalog_lock(self) -> Iterator[None]:
        """Hold the catalog's exclusive file lock (every catalog session and every copy of the store takes it)."""
        try:
            fh = open(self._lock_path, "a+")
        except OSError as err:
            raise disk_error(err, self._lock_path) or err from None
        with fh:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreError(
                            f"another dagrag process has held {self.root / CATALOG} for {LOCK_TIMEOUT_S:.0f} s; "
                            "wait for it to finish or point artifacts_dir elsewhere") from None
                    time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextmanager
    def catalog(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived catalog connection, held under an exclusive file lock."""
        with self._catalog_lock(), _HOST_LOCK:
            con = _connect_catalog(self._catalog_path, self._catalog_alias)
            try:
                con.execute(_SCHEMA)
                if not self._root_followed:
                    self._rebase_catalog(con)
                    self._root_followed = True
                yield con
            except duckdb.Error as err:  # a damaged block met by a query, a full disk: one line that says what to do
                raise catalog_error(self._catalog_path, err) or err from None
            finally:
                _detach(con, self._catalog_alias)

    @contextmanager
    def writing(self) -> Iterator[Any]:
        """A catalog session whose statements are one transaction: all of them are recorded, or (an error, a
        kill at any point before the COMMIT) none. Every write to the catalog goes through here, so no reader ever
        sees a stage with part of its outputs recorded, or a half-made run or metrics record."""
        with self.catalog() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield _Writer(con)
                fault_point()
                con.execute("COMMIT")
                fault_point("(committed, not yet detached)")
            except BaseException:
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:  # already ended by the error: detaching discards it all the same
                    pass
                raise

    def _rebase_catalog(self, con: duckdb.DuckDBPyConnection) -> None:
        """Make a catalog written under another root (the folder was moved, or copied by ``cp -r`` or rsync) name
        the files under this one: every path under the old root that it holds (stage outputs, run manifests,
        metrics) is rewritten, and the views are made again, in one transaction. Without this every lookup of a
        moved store missed, so every stage ran again. The root is recorded in ``store_root``; a catalog written
        before that table existed has its root read off its stage rows (``<root>/<dataset>/<stage>/<file>``)."""
        recorded = con.execute("SELECT root FROM store_root").fetchall()
        old, new = (recorded[0][0] if recorded else _written_root(con)), str(self.root)
        if recorded == [(new,)]:
            return
        con.execute("BEGIN TRANSACTION")
        try:
            if old is not None and old != new:
                log.info("this store was written at %s and is now at %s (moved or copied): its catalog now names "
                         "the files here", old, new)
                self._rewrite_root(con, old, new)
            con.execute("DELETE FROM store_root")
            con.execute("INSERT INTO store_root VALUES (?)", [new])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise

    def _rewrite_root(self, con: duckdb.DuckDBPyConnection, old: str, new: str) -> None:
        """``old`` → ``new`` at the start of every path in every text column of the catalog; views made again."""
        tables = con.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = "
                             "current_database() AND table_type = 'BASE TABLE'").fetchall()
        for (table,) in tables:
            cols = con.execute("SELECT column_name FROM information_schema.columns WHERE table_catalog = "
                               "current_database() AND table_name = ? AND data_type IN ('VARCHAR', 'JSON')",
                               [table]).fetchall()
            for (col,) in cols:  # the root as a path prefix (followed by /), or a whole value
                con.execute(f'UPDATE "{table}" SET "{col}" = replace(replace("{col}"::VARCHAR, ?, ?), ?, ?) '
                            f'WHERE contains("{col}"::VARCHAR, ?)',
                            [old + "/", new + "/", f'"{old}"', f'"{new}"', old])
                con.execute(f'UPDATE "{table}" SET "{col}" = ? WHERE "{col}"::VARCHAR = ?', [new, old])
        latest = con.execute("SELECT name, path FROM stages WHERE path LIKE '%.parquet' ORDER BY rowid").fetchall()
        self._refresh_views(con, {name: path for name, path in latest if Path(path).exists()})

    @staticmethod
    def _refresh_views(con: duckdb.DuckDBPyConnection, paths: Mapping[str, str]) -> None:
        """DuckDB views named after each artifact (``{name: path}``), over its latest Parquet file (none over a
        file that fails the cheap check: DuckDB reads its schema, and a failed statement would abort the session's
        transaction)."""
        for name, path in paths.items():
            if not path.endswith(".parquet"):
                continue
            if file_problem(path, None) is None:
                safe = path.replace("'", "''")
                con.execute(f'CREATE OR REPLACE VIEW "{name}" AS SELECT * FROM read_parquet(\'{safe}\')')
            else:
                con.execute(f'DROP VIEW IF EXISTS "{name}"')

    def query(self, sql: str, params: list | None = None) -> pd.DataFrame:
        """Run a read query on the catalog and return a frame (fully consumed)."""
        with self.catalog() as con:
            return con.execute(sql, params or []).df()

    def versions(self, stage: str, name: str, dataset: str, params: Any) -> list[tuple[str, str, dict[str, str]]]:
        """Stored ``(fp, path, input_fps)`` of output ``name`` of ``stage`` for ``dataset`` made with these
        params, newest first, whose file still exists: the bases an incremental update may start from."""
        with self.catalog() as con:
            rows = con.execute("SELECT fp, path, params, input_fps, bytes FROM stages WHERE stage = ? AND name = ? "
                               "AND dataset = ? ORDER BY created_at DESC", [stage, name, dataset]).fetchall()
        want = json.loads(json.dumps(params, default=json_default))
        return [(fp, path, json.loads(inputs)) for fp, path, kept, inputs, size in rows
                if json.loads(kept) == want and file_problem(path, size) is None]

    def event(self, run_id: str, stage: str, fp: str, dataset: str, status: str, *, rows: int,
              rows_computed: int, seconds: float, peak_rss_mb: float) -> None:
        """Log one stage execution ('computed') or skip ('cached') within a run."""
        with self.writing() as con:
            con.execute("INSERT INTO stage_events (run_id, stage, fp, dataset, status, rows, rows_computed, seconds, "
                        "peak_rss_mb, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                        [run_id, stage, fp, dataset, status, rows, rows_computed, seconds,
                         peak_rss_mb, dt.datetime.now()])

    def record_run(self, run_id: str, command: str, manifest: Mapping[str, Any]) -> None:
        """Register a run and its manifest; its status is ``running`` until :meth:`end_run`."""
        with self.writing() as con:
            con.execute("INSERT INTO runs (run_id, command, started_at, manifest, status) VALUES (?,?,?,?,?)",
                        [run_id, command, dt.datetime.now(), json.dumps(manifest, default=json_default),
                         "running"])

    def end_run(self, run_id: str, status: str) -> None:
        """Record how a run ended (``completed``, ``failed``, ``crashed``: Ctrl-C or a crash, ``cancelled``) and
        when. A run killed outright stays ``running``; one recorded before this column existed has no status."""
        with self.writing() as con:
            con.execute("UPDATE runs SET status = ?, ended_at = ? WHERE run_id = ?",
                        [status, dt.datetime.now(), run_id])

    def record_metrics(self, run_id: str, kind: str, method: str, dataset: str, metrics: Mapping[str, Any],
                       overrides: Mapping[str, str] | None = None) -> None:
        """Store one evaluation/benchmark result, with the command-line overrides of its run."""
        with self.writing() as con:
            con.execute("INSERT INTO metrics (run_id, kind, method, dataset, created_at, metrics, overrides) "
                        "VALUES (?,?,?,?,?,?,?)",
                        [run_id, kind, method, dataset, dt.datetime.now(), json.dumps(metrics, default=json_default),
                         json.dumps(dict(overrides or {}))])

    def record_ledger(self, run_id: str, stage: str, summary: Mapping[str, Any]) -> None:
        """Token ledger of one stage in one run (calls, cache hits, tokens, seconds, failed requests)."""
        with self.writing() as con:
            con.execute("INSERT INTO llm_ledger (run_id, stage, llm_calls, llm_cache_hits, prompt_tokens, "
                        "completion_tokens, seconds, created_at, llm_failed) VALUES (?,?,?,?,?,?,?,?,?)",
                        [run_id, stage, summary["llm_calls"], summary["llm_cache_hits"], summary["prompt_tokens"],
                         summary["completion_tokens"], summary["seconds"], dt.datetime.now(),
                         summary.get("llm_failed", 0)])

    def events(self, run_id: str) -> pd.DataFrame:
        """The stage events of one run, in order."""
        return self.query("SELECT * FROM stage_events WHERE run_id = ? ORDER BY created_at", [run_id])

    def output_rows(self, run_id: str) -> pd.DataFrame:
        """``(stage, fp, name, rows, path, seconds, peak_rss_mb)`` of every output of the stages one run computed or
        reused, in write order (seconds and peak: the computing run's, repeated on each of a stage's outputs)."""
        return self.query("SELECT s.stage, s.fp, s.name, s.rows, s.path, s.seconds, s.peak_rss_mb FROM stages s "
                          "JOIN (SELECT DISTINCT stage, fp "
                          "FROM stage_events WHERE run_id = ?) e USING (stage, fp) ORDER BY s.rowid", [run_id])

    # -- row-cache parts -------------------------------------------------------------
    def record_part(self, path: Path) -> None:
        """Register a row-cache part with its size and content hash (once, whoever registers it first)."""
        size, digest = file_digest(path)
        with self.writing() as con:
            con.execute("INSERT INTO row_parts SELECT ?, ?, ?, ? WHERE NOT EXISTS "
                        "(SELECT 1 FROM row_parts WHERE path = ?)", [str(path), size, digest, dt.datetime.now(),
                                                                      str(path)])

    def forget_part(self, path: Path) -> None:
        """Remove a row-cache part's registration (it was dropped)."""
        with self.writing() as con:
            con.execute("DELETE FROM row_parts WHERE path = ?", [str(path)])

    def recorded_parts(self, folder: Path) -> dict[str, int]:
        """``{path: bytes}`` of the registered parts under ``folder``."""
        with self.catalog() as con:
            return dict(con.execute("SELECT path, bytes FROM row_parts WHERE starts_with(path, ?)",
                                    [f"{folder}/"]).fetchall())
