"""The stage store: every artifact path, atomic write and catalog row lives here.

Layout under ``artifacts_dir``::

    catalog.duckdb                              the catalog (stages, stage_events, runs, metrics, views)
    _locks/<stage>-<fp>.lock                    held while a process computes that stage (holder's pid inside)
    <dataset>/<stage>/<name>-<fp>.parquet       a stage's outputs, addressed by its fingerprint
    _rows/<stage>/<param_fp>/part-*.parquet     row caches of per-row stages (chunk, ner, embed)
    _quarantine/<when>/<relative path>          damaged files, moved aside (never deleted) by a run or the doctor

A stage's fingerprint is a content hash of (stage name, the source of the modules
holding it and the pure functions it calls, its config slice, its input fingerprints).
Outputs are written to a temp file and renamed into place; the catalog row is written
last, so a run killed at any point leaves nothing that a later run trusts. The catalog
is opened only for short, file-locked transactions, so two processes sharing one
``artifacts_dir`` queue behind each other instead of corrupting it; and a stage being
computed is locked (:meth:`Store.stage_lock`), so a second run waits for it and reuses it
instead of computing it again.

Every file a stage or a row cache writes has its size and content hash (BLAKE2b) recorded in the catalog
(``stages.bytes, stages.digest``; ``row_parts``), and Parquet files are written with page checksums. A cached
stage is trusted only after a cheap check (:func:`file_problem`: the recorded size, a readable Parquet footer
holding the recorded rows); a non-Parquet file's hash is checked when it is read (:meth:`Store.read_bytes`),
a Parquet page's CRC when the page is read. Full hashes are ``dagrag doctor``'s job (``flows.doctor``).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import duckdb
import numpy as np
import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

log = logging.getLogger("dagrag")

CATALOG = "catalog.duckdb"
LOCKS = "_locks"
ROWS = "_rows"
QUARANTINE = "_quarantine"
# files that are written once (temp file + rename) and never changed: a copy of the store may hard-link them
LINKABLE_SUFFIXES = frozenset({".parquet", ".npy", ".bin", ".tar"})
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
"""
# how the fix for a catalog that cannot be read is worded, wherever that is found
REBUILD_HINT = "run `dagrag doctor doctor.repair=true artifacts_dir={root}` to rebuild it from the files it can verify"
# what DuckDB says of a damaged database file (a truncated one, a failed block checksum, a foreign file)
_DAMAGED_CATALOG = ("could not read enough bytes", "corrupt database", "checksum", "not a valid duckdb",
                    "invalid database", "failed to read database header")
# the OS errors that a full, read-only or forbidden disk gives, each with its fix
DISK_ERRORS = {
    errno.ENOSPC: ("no space left on the device", "free space there (or point artifacts_dir at another disk), "
                   "then run the same command again: the stages that finished are kept"),
    errno.EDQUOT: ("disk quota exceeded", "free space there (or point artifacts_dir at another disk), "
                   "then run the same command again: the stages that finished are kept"),
    errno.EROFS: ("read-only file system", "point artifacts_dir at a writable folder"),
    errno.EACCES: ("permission denied", "make it writable for this user, or point artifacts_dir elsewhere"),
    errno.EPERM: ("operation not permitted", "make it writable for this user, or point artifacts_dir elsewhere"),
    errno.ENOTDIR: ("a file is in the way of a folder", "remove that file, or point artifacts_dir elsewhere"),
}


class StoreError(RuntimeError):
    """The artifact store cannot do what was asked; the message says what to fix."""


class CatalogDamaged(StoreError):
    """The catalog cannot be read; ``reason`` is what DuckDB said."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class DamagedFile(StoreError):
    """A stored file failed its check when read; it has been moved to the quarantine."""


def disk_error(err: OSError, path: str | os.PathLike | None = None) -> StoreError | None:
    """A one-line :class:`StoreError` naming the path and the fix for a full, read-only or forbidden disk;
    None for any other OS error."""
    if err.errno not in DISK_ERRORS:
        return None
    what, fix = DISK_ERRORS[err.errno]
    return StoreError(f"{what} writing {err.filename or path}: {fix}")


@dataclass(frozen=True)
class ArtifactRef:
    """A small, picklable reference to one stored artifact (what tasks return), with its recorded content hash
    (None: recorded before hashes were)."""

    name: str
    path: str
    fp: str
    rows: int
    digest: str | None = None


def short_hash(payload: Any, n: int = 16) -> str:
    """Stable hex digest of any JSON-serialisable payload."""
    blob = json.dumps(payload, sort_keys=True, default=_json_default).encode()
    return hashlib.sha256(blob).hexdigest()[:n]


def _json_default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON-serialisable in a fingerprint: {type(obj).__name__}")


def fingerprint(stage: str, code: str, params: Any, inputs: Mapping[str, str]) -> str:
    """A stage's identity: hash(stage, code version, config slice, input fingerprints)."""
    return short_hash({"stage": stage, "code": code, "params": params, "inputs": dict(sorted(inputs.items()))})


def file_digest(path: str | os.PathLike) -> tuple[int, str]:
    """``(size in bytes, BLAKE2b-128 hex digest)`` of a file's content."""
    with open(path, "rb") as fh:
        digest = hashlib.file_digest(fh, lambda: hashlib.blake2b(digest_size=16)).hexdigest()
    return os.path.getsize(path), digest


def file_problem(path: str | os.PathLike, size: int | None, rows: int | None = None) -> str | None:
    """What is wrong with a stored file by the cheap check a run makes before trusting it, or None: it exists,
    has the recorded ``size`` (None: not recorded), and, for Parquet, its footer reads and holds ``rows`` rows
    (None: any). The content hash is not read here (``dagrag doctor`` does that)."""
    try:
        actual = os.path.getsize(path)
    except FileNotFoundError:
        return "is missing"
    if size is not None and actual != size:
        return f"has {actual} bytes, {size} recorded"
    if str(path).endswith(".parquet"):
        try:
            n = pq.read_metadata(path).num_rows
        except (OSError, pa.ArrowException) as err:
            return f"has no readable Parquet footer ({_first_line(err)})"
        if rows is not None and n != rows:
            return f"holds {n} rows, {rows} recorded"
    return None


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def text_key(text: str) -> str:
    """Content key of a text (identical texts share one row in a row cache)."""
    return "txt-" + hashlib.sha1(text.encode()).hexdigest()[:20]


# ----------------------------------------------------------------------------- arrays in Parquet

# A vector column is FixedSizeBinary[4d]: each value is one row's d float32s, little-endian. Parquet stores it as
# flat fixed-length values, which read as a copy. The FixedSizeList<float32>[d] written before is a nested
# column: Parquet decodes a repetition level per float, so 450,324 × 384 took 5.7-9.9 s and a 3.0 GB high-water
# mark to read, against 0.5-1.4 s and 1.6 GB. Files in the old layout stay readable; `Store.write_parquet` writes
# the new one.

def embeddings_to_arrow(matrix: np.ndarray) -> pa.FixedSizeBinaryArray:
    """(n, d) float32 → a FixedSizeBinary[4d] column, one row's float32 bytes (little-endian) per value."""
    matrix = np.ascontiguousarray(matrix, dtype="<f4")
    if matrix.ndim != 2:
        raise ValueError(f"embeddings must be a 2-d (n, d) array, not shape {matrix.shape}")
    n, d = matrix.shape
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(4 * d), n, [None, pa.py_buffer(matrix)])


def embedding_width(kind: pa.DataType) -> int:
    """d of a vector column's type: FixedSizeBinary[4d], or the older FixedSizeList<float32>[d]."""
    if pa.types.is_fixed_size_binary(kind) and kind.byte_width % 4 == 0:
        return kind.byte_width // 4
    if pa.types.is_fixed_size_list(kind) and pa.types.is_float32(kind.value_type):
        return kind.list_size
    raise TypeError(f"not a column of float32 vectors: {kind}")


def arrow_to_embeddings(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A vector column (either layout) → a new (n, d) float32 array, C-contiguous and writable.

    Chunks are copied one by one into the result: no combined copy of the column is made first.
    """
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    d = embedding_width(column.type)
    out = np.empty((len(column), d), np.float32)
    start = 0
    for chunk in chunks:
        n = len(chunk)
        if chunk.null_count:
            raise ValueError("a vector column holds nulls")
        if n and d:
            if pa.types.is_fixed_size_binary(chunk.type):
                flat = np.frombuffer(chunk.buffers()[1], dtype="<f4", count=n * d, offset=chunk.offset * 4 * d)
            else:
                flat = chunk.flatten().to_numpy(zero_copy_only=False)
            out[start:start + n] = flat.reshape(n, d)
        start += n
    return out


def release_arrow_memory() -> None:
    """Hand back to the OS the memory Arrow's pool kept after its tables were freed. Its allocator (mimalloc)
    holds freed pages for reuse: after 450,324 vectors were read, their 690 MB stayed in the process's RSS."""
    pa.default_memory_pool().release_unused()


def current_layout(table: pa.Table) -> pa.Table:
    """``table`` with any vector column in the older FixedSizeList<float32> layout rewritten as FixedSizeBinary
    (the same values), so that parts written before and after the change concatenate."""
    for i, field in enumerate(table.schema):
        if pa.types.is_fixed_size_list(field.type) and pa.types.is_float32(field.type.value_type):
            table = table.set_column(i, field.name, embeddings_to_arrow(arrow_to_embeddings(table.column(i))))
    return table


# ----------------------------------------------------------------------------- writing and checking files

@contextmanager
def _atomic(path: Path) -> Iterator[Path]:
    """A temp file beside ``path`` to write, renamed onto ``path`` when the block ends; on any failure it is
    removed, and a full, read-only or forbidden disk becomes a one-line :class:`StoreError`."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        yield tmp
        os.replace(tmp, path)
    except BaseException as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(err, OSError):
            raise disk_error(err, path) or err from None
        raise


def parquet_problem(path: str | os.PathLike) -> str | None:
    """What a full read of a Parquet file finds wrong with it (every page decoded, and checked against its CRC
    where it has one), or None."""
    try:
        with pq.ParquetFile(path, memory_map=True, page_checksum_verification=True) as f:
            for i in range(f.num_row_groups):
                f.read_row_group(i)
    except (OSError, pa.ArrowException) as err:
        return _first_line(err)
    return None


def store_root_of(path: str | os.PathLike) -> Path | None:
    """The ``artifacts_dir`` that holds a stage output or row-cache part (the folder with the catalog above it)."""
    for parent in Path(path).resolve().parents:
        if (parent / CATALOG).exists() or (parent / ".catalog.lock").exists():
            return parent
    return None


def quarantine(path: str | os.PathLike, root: Path | None = None) -> Path:
    """Move a file into ``<root>/_quarantine/<time>/<its path under root>`` (never deleted); returns where."""
    path = Path(path).resolve()
    root = root or store_root_of(path) or path.parent
    rel = path.relative_to(root) if path.is_relative_to(root) else Path(path.name)
    dst = root / QUARANTINE / dt.datetime.now().strftime("%Y%m%d-%H%M%S") / rel
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, dst)
    return dst


def quarantine_damaged(path: str | os.PathLike, why: str) -> DamagedFile:
    """Move a damaged file to the quarantine and return the one-line error that says so and what to do."""
    try:
        where = f"it was moved to {quarantine(path)}"
    except OSError as err:
        where = f"it could not be moved aside ({err.strerror})"
    return DamagedFile(f"{path} is damaged ({why}); {where}: run the same command again to compute it anew")


# ----------------------------------------------------------------------------- peak memory

class PeakRSS:
    """Context manager sampling this process's RSS; ``.mb`` is the peak seen inside."""

    def __init__(self, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.mb = 0.0
        self._stop = threading.Event()
        self._proc = psutil.Process()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.mb = max(self.mb, self._proc.memory_info().rss / 2**20)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "PeakRSS":
        self.mb = self._proc.memory_info().rss / 2**20
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.mb = max(self.mb, self._proc.memory_info().rss / 2**20)


# ----------------------------------------------------------------------------- locks

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
    text = _first_line(err)
    low = text.lower()
    for code, (what, fix) in DISK_ERRORS.items():
        if os.strerror(code).lower() in low:
            return StoreError(f"{what} writing the catalog {path}: {fix}")
    if any(sign in low for sign in _DAMAGED_CATALOG):
        return CatalogDamaged(f"the catalog {path} is damaged ({text}): {REBUILD_HINT.format(root=path.parent)}",
                              text)
    return None


def _read_pid(fd: int) -> int | None:
    """The pid a stage lock's holder wrote into it (None while it is being written)."""
    try:
        return int(os.pread(fd, 32, 0).decode().strip())
    except (ValueError, OSError):
        return None


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is still the file at ``path`` (not removed or replaced)."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _written_root(con: duckdb.DuckDBPyConnection) -> str | None:
    """The root a catalog without ``store_root`` was written under, read off its stage rows' paths
    (:meth:`Store.path_for`: ``<root>/<dataset>/<stage>/<file>``) if they all agree; else None."""
    roots = {str(path.parents[2]) for dataset, stage, path in
             ((d, s, Path(p)) for d, s, p in con.execute("SELECT dataset, stage, path FROM stages").fetchall())
             if path.parent.name == stage and path.parent.parent.name == dataset}
    return roots.pop() if len(roots) == 1 else None


# ----------------------------------------------------------------------------- the store

class Store:
    """All I/O under ``artifacts_dir``: paths, atomic writes, row caches and the catalog."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.root / ".catalog.lock"
        self._catalog_path = self.root / CATALOG
        self._catalog_alias = _catalog_alias(self._catalog_path)  # its name while attached to the host
        self._root_followed = False  # whether this object's first catalog session checked the recorded root

    # -- catalog ---------------------------------------------------------------
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

    def copy_to(self, dst: str | os.PathLike) -> "Store":
        """A copy of this store at ``dst`` (which must not exist) whose catalog names the copy's own files.

        Artifact files are never changed after their atomic rename into place, so the copy hard-links them
        (a copy of a whole index costs almost no time or disk; a plain copy where links are impossible);
        anything written in place (DuckDB files: the catalog, an LLM cache) is copied. Taken under the
        catalog's lock, so no stage is recorded half-way; assembled beside ``dst`` and renamed into place, and
        removed again if its catalog cannot be rewritten, so a failed copy leaves no store behind. Every
        absolute path under this store's root that the catalog holds (stage outputs, run manifests, metrics)
        is rewritten to the copy's, and the artifact views are made again over the copy's files.
        """
        dst = Path(dst).resolve()
        if dst.exists():
            raise StoreError(f"cannot copy the store to {dst}: it exists")
        if dst.is_relative_to(self.root):
            raise StoreError(f"cannot copy the store {self.root} into itself ({dst})")
        tmp = dst.with_name(f".{dst.name}.copy-{uuid.uuid4().hex[:8]}")
        try:
            with self._catalog_lock():
                for src in sorted(self.root.rglob("*")):
                    rel = src.relative_to(self.root)
                    if rel.parts[0] == LOCKS or rel.name == self._lock_path.name or src.is_dir():
                        continue
                    target = tmp / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if src.suffix in LINKABLE_SUFFIXES:
                        try:
                            os.link(src, target)
                            continue
                        except OSError:  # another file system, or links not allowed
                            pass
                    shutil.copy2(src, target)
            tmp.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dst)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        copy = Store(dst)
        try:  # after the rename: a view is checked against the file it reads
            with copy.catalog():  # its first session rewrites the catalog for the copy's root
                pass
        except BaseException:
            shutil.rmtree(dst, ignore_errors=True)
            raise
        return copy

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
        self._refresh_views(con, {name: ArtifactRef(name, path, "", 0) for name, path in latest
                                  if Path(path).exists()})

    @contextmanager
    def stage_lock(self, stage: str, fp: str, *, on_wait: Callable[[int | None], None] | None = None,
                   timeout_s: float | None = None, poll_s: float = 0.1) -> Iterator[None]:
        """Hold the exclusive lock on computing ``(stage, fp)`` in this ``artifacts_dir``.

        An ``flock`` on ``_locks/<stage>-<fp>.lock``, which holds the holder's pid. If another
        process (or thread) holds it, ``on_wait(holder_pid or None)`` is called once and this waits:
        forever with ``timeout_s=None`` (a stage may take hours), else up to ``timeout_s`` and then
        :class:`StoreError`. Released on exit, exceptions included; a killed holder's lock is
        released by the OS when its process dies, so a crash never blocks a later run (the stale
        file is taken over). The file is removed on release; a waiter that locked a removed file
        notices (its inode is no longer at the path) and locks the new one.
        """
        path = self.root / LOCKS / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', stage)}-{fp}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        told = False
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if not told:
                            told = True
                            if on_wait is not None:
                                on_wait(_read_pid(fd))
                        if deadline is not None and time.monotonic() > deadline:
                            raise StoreError(f"{stage} [{fp}] has been computed by another run (pid "
                                             f"{_read_pid(fd)}) for over {timeout_s:.0f} s; lock: {path}") from None
                        time.sleep(poll_s)
                if _is_at(fd, path):
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the holder removed this file on release: lock the one now at the path
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            path.unlink(missing_ok=True)  # before unlocking, so no waiter trusts a removed file
            os.close(fd)  # releases the flock

    def query(self, sql: str, params: list | None = None) -> pd.DataFrame:
        """Run a read query on the catalog and return a frame (fully consumed)."""
        with self.catalog() as con:
            return con.execute(sql, params or []).df()

    # -- paths and atomic writes ----------------------------------------------
    def path_for(self, dataset: str, stage: str, name: str, fp: str, ext: str = "parquet") -> Path:
        """Address of a stage output: ``<dataset>/<stage>/<name>-<fp>.<ext>``."""
        return self.root / dataset / stage / f"{name}-{fp}.{ext}"

    @staticmethod
    def write_parquet(table: pd.DataFrame | pa.Table, path: Path) -> int:
        """Write atomically (temp file + rename); returns the row count."""
        if isinstance(table, pd.DataFrame):
            table = pa.Table.from_pandas(table, preserve_index=False)
        with _atomic(path) as tmp:
            pq.write_table(table, tmp, write_page_checksum=True)
        return table.num_rows

    @staticmethod
    def write_bytes(data: bytes, path: Path) -> None:
        """Write a non-tabular artifact atomically."""
        with _atomic(path) as tmp:
            tmp.write_bytes(data)

    @staticmethod
    def read(ref: ArtifactRef | str | Path, columns: list[str] | None = None) -> pd.DataFrame:
        """Read a Parquet artifact into pandas."""
        return Store.read_arrow(ref, columns).to_pandas()

    @staticmethod
    def read_arrow(ref: ArtifactRef | str | Path, columns: list[str] | None = None) -> pa.Table:
        """Read a Parquet artifact as an Arrow table (memory-mapped: the file's pages are not copied once more
        into a read buffer), each page checked against its CRC where it has one; a damaged file is moved to the
        quarantine and :class:`DamagedFile` raised."""
        path = ref.path if isinstance(ref, ArtifactRef) else ref
        try:
            return pq.read_table(path, columns=columns, memory_map=True, page_checksum_verification=True)
        except (OSError, pa.ArrowException):
            problem = parquet_problem(path) if os.path.exists(path) else None
            if problem is None:
                raise  # not the file's fault (a wrong column name, say): the error as it is
            raise quarantine_damaged(path, problem) from None

    @staticmethod
    def read_bytes(ref: ArtifactRef | str | Path) -> bytes:
        """Read a non-tabular artifact whole, checked against its recorded content hash (when the reference
        carries one); a damaged file is moved to the quarantine and :class:`DamagedFile` raised."""
        path = ref.path if isinstance(ref, ArtifactRef) else str(ref)
        data = Path(path).read_bytes()
        digest = ref.digest if isinstance(ref, ArtifactRef) else None
        if digest is not None and hashlib.blake2b(data, digest_size=16).hexdigest() != digest:
            raise quarantine_damaged(path, "its content hash differs from the one recorded when it was written")
        return data

    # -- stage records -----------------------------------------------------------
    def lookup(self, stage: str, fp: str, warn: bool = True) -> dict[str, ArtifactRef] | None:
        """Outputs of a finished stage with this fingerprint, if every file passes the cheap check
        (:func:`file_problem`: there, the recorded size, a readable Parquet footer with the recorded rows). A file
        that fails it is named in one log line (``warn``), and the stage is to be computed again."""
        with self.catalog() as con:  # plain tuples: a pandas frame per lookup cost more than the query
            rows = con.execute("SELECT name, path, rows, bytes, digest FROM stages WHERE stage = ? AND fp = ?",
                               [stage, fp]).fetchall()
        if not rows:
            return None
        for _, path, n, size, _ in rows:
            problem = file_problem(path, size, n)
            if problem is not None:
                if warn:
                    log.warning("%s [%s]: %s %s, so the stage is computed again", stage, fp, path, problem)
                return None
        return {name: ArtifactRef(name, path, fp, int(n), digest) for name, path, n, _, digest in rows}

    def versions(self, stage: str, name: str, dataset: str, params: Any) -> list[tuple[str, str, dict[str, str]]]:
        """Stored ``(fp, path, input_fps)`` of output ``name`` of ``stage`` for ``dataset`` made with these
        params, newest first, whose file still exists: the bases an incremental update may start from."""
        with self.catalog() as con:
            rows = con.execute("SELECT fp, path, params, input_fps, bytes FROM stages WHERE stage = ? AND name = ? "
                               "AND dataset = ? ORDER BY created_at DESC", [stage, name, dataset]).fetchall()
        want = json.loads(json.dumps(params, default=_json_default))
        return [(fp, path, json.loads(inputs)) for fp, path, kept, inputs, size in rows
                if json.loads(kept) == want and file_problem(path, size) is None]

    def record(self, stage: str, fp: str, dataset: str, refs: Mapping[str, ArtifactRef], *,
               input_fps: Mapping[str, str], params: Any, rows_computed: int,
               seconds: float, peak_rss_mb: float, run_id: str) -> dict[str, ArtifactRef]:
        """Register a finished stage (called last, after its files are in place), with each file's size and
        content hash; returns ``refs`` with those hashes (what a later lookup returns)."""
        now = dt.datetime.now()
        sums = {name: file_digest(ref.path) for name, ref in refs.items()}
        with self.catalog() as con:
            con.execute("DELETE FROM stages WHERE stage = ? AND fp = ?", [stage, fp])
            for ref in refs.values():
                con.execute(
                    "INSERT INTO stages (stage, name, fp, dataset, path, input_fps, params, rows, rows_computed, seconds, "
                    "peak_rss_mb, created_at, run_id, bytes, digest) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [stage, ref.name, fp, dataset, ref.path, json.dumps(dict(input_fps)),
                     json.dumps(params, default=_json_default), ref.rows, rows_computed,
                     seconds, peak_rss_mb, now, run_id, *sums[ref.name]])
            self._refresh_views(con, refs)
        return {name: dataclasses.replace(ref, digest=sums[name][1]) for name, ref in refs.items()}

    @staticmethod
    def _refresh_views(con: duckdb.DuckDBPyConnection, refs: Mapping[str, ArtifactRef]) -> None:
        """DuckDB views named after each artifact, over its latest Parquet file (none over a file that fails the
        cheap check: DuckDB reads its schema, and a failed statement would abort the session's transaction)."""
        for ref in refs.values():
            if not ref.path.endswith(".parquet"):
                continue
            if file_problem(ref.path, None) is None:
                safe = ref.path.replace("'", "''")
                con.execute(f'CREATE OR REPLACE VIEW "{ref.name}" AS SELECT * FROM read_parquet(\'{safe}\')')
            else:
                con.execute(f'DROP VIEW IF EXISTS "{ref.name}"')

    def event(self, run_id: str, stage: str, fp: str, dataset: str, status: str, *, rows: int,
              rows_computed: int, seconds: float, peak_rss_mb: float) -> None:
        """Log one stage execution ('computed') or skip ('cached') within a run."""
        with self.catalog() as con:
            con.execute("INSERT INTO stage_events (run_id, stage, fp, dataset, status, rows, rows_computed, seconds, "
                        "peak_rss_mb, created_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                        [run_id, stage, fp, dataset, status, rows, rows_computed, seconds,
                         peak_rss_mb, dt.datetime.now()])

    def record_run(self, run_id: str, command: str, manifest: Mapping[str, Any]) -> None:
        """Register a run and its manifest; its status is ``running`` until :meth:`end_run`."""
        with self.catalog() as con:
            con.execute("INSERT INTO runs (run_id, command, started_at, manifest, status) VALUES (?,?,?,?,?)",
                        [run_id, command, dt.datetime.now(), json.dumps(manifest, default=_json_default),
                         "running"])

    def end_run(self, run_id: str, status: str) -> None:
        """Record how a run ended (``completed``, ``failed``, ``crashed``: Ctrl-C or a crash, ``cancelled``) and
        when. A run killed outright stays ``running``; one recorded before this column existed has no status."""
        with self.catalog() as con:
            con.execute("UPDATE runs SET status = ?, ended_at = ? WHERE run_id = ?",
                        [status, dt.datetime.now(), run_id])

    def record_metrics(self, run_id: str, kind: str, method: str, dataset: str, metrics: Mapping[str, Any],
                       overrides: Mapping[str, str] | None = None) -> None:
        """Store one evaluation/benchmark result, with the command-line overrides of its run."""
        with self.catalog() as con:
            con.execute("INSERT INTO metrics (run_id, kind, method, dataset, created_at, metrics, overrides) "
                        "VALUES (?,?,?,?,?,?,?)",
                        [run_id, kind, method, dataset, dt.datetime.now(), json.dumps(metrics, default=_json_default),
                         json.dumps(dict(overrides or {}))])

    def record_ledger(self, run_id: str, stage: str, summary: Mapping[str, Any]) -> None:
        """Token ledger of one stage in one run (calls, cache hits, tokens, seconds, failed requests)."""
        with self.catalog() as con:
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

    # -- row caches (per-row incremental stages) ----------------------------------
    def row_cache(self, stage: str, param_fp: str, key: str) -> "RowCache":
        """The row cache of a per-row stage under these params (shared by every dataset and run)."""
        return RowCache(self.root / ROWS / stage / param_fp, key, self)

    def record_part(self, path: Path) -> None:
        """Register a row-cache part with its size and content hash (once, whoever registers it first)."""
        size, digest = file_digest(path)
        with self.catalog() as con:
            con.execute("INSERT INTO row_parts SELECT ?, ?, ?, ? WHERE NOT EXISTS "
                        "(SELECT 1 FROM row_parts WHERE path = ?)", [str(path), size, digest, dt.datetime.now(),
                                                                      str(path)])

    def forget_part(self, path: Path) -> None:
        """Remove a row-cache part's registration (it was dropped)."""
        with self.catalog() as con:
            con.execute("DELETE FROM row_parts WHERE path = ?", [str(path)])

    def recorded_parts(self, folder: Path) -> dict[str, int]:
        """``{path: bytes}`` of the registered parts under ``folder``."""
        with self.catalog() as con:
            return dict(con.execute("SELECT path, bytes FROM row_parts WHERE starts_with(path, ?)",
                                    [f"{folder}/"]).fetchall())


class RowCache:
    """Rows of one per-row stage computed under one param fingerprint: parquet parts, appended atomically.

    A row is addressed by its ``key`` column (a doc id or a text hash), so a grown corpus computes
    only the keys it has not seen and a shrunk one reads fewer.
    """

    def __init__(self, folder: Path, key: str, store: Store | None = None) -> None:
        self.folder, self.key, self.store = folder, key, store  # store: where parts are registered and checked
        # each part's key column, read once per instance: a part never changes once written (uuid name, atomic),
        # so a stage's missing() and read() do not both read every part's keys
        self._part_keys: dict[Path, pa.Array] = {}

    def _parts(self) -> list[Path]:
        return sorted(self.folder.glob("part-*.parquet"))

    def _key_columns(self) -> tuple[list[Path], list[pa.Array]]:
        """Every sound part and its key column (the key column alone is read: a small share of a part's bytes).

        A part is checked as a stage output is (:func:`file_problem`: its recorded size and footer) and its key
        column read with page checksums; one that fails is dropped (:meth:`_drop`), so its rows count as not
        computed. A sound part that is not registered (written before parts were, or by a run killed between
        its write and its registration) is registered now."""
        parts = self._parts()
        fresh = [p for p in parts if p not in self._part_keys]
        recorded = self.store.recorded_parts(self.folder) if fresh and self.store is not None else {}
        for p in fresh:
            problem = file_problem(p, recorded.get(str(p)))
            if problem is None:
                try:
                    with pq.ParquetFile(p, page_checksum_verification=True) as f:
                        self._part_keys[p] = f.read(columns=[self.key]).column(self.key).combine_chunks()
                except (OSError, pa.ArrowException) as err:
                    problem = f"is unreadable ({_first_line(err)})"
            if problem is not None:
                self._drop(p, problem)
            elif str(p) not in recorded and self.store is not None:
                self.store.record_part(p)
        parts = [p for p in parts if p in self._part_keys]
        return parts, [self._part_keys[p] for p in parts]

    def _drop(self, part: Path, problem: str) -> None:
        """Move a damaged part to the quarantine, with one log line; its rows are computed again."""
        self._part_keys.pop(part, None)
        if not part.exists():  # another process dropped it first
            return
        dst = quarantine(part, self.store.root if self.store is not None else None)
        if self.store is not None:
            self.store.forget_part(part)
        log.warning("row cache part %s %s: moved to %s, and its rows are computed again", part, problem, dst)

    def keys(self) -> set[str]:
        """Keys already computed."""
        return {k for col in self._key_columns()[1] for k in col.to_pylist()}

    def missing(self, wanted: list[str]) -> list[str]:
        """The keys of ``wanted`` not computed yet, in order."""
        done = self.keys()
        return [k for k in wanted if k not in done]

    def append(self, table: pa.Table | pd.DataFrame) -> None:
        """Add a part of newly computed rows (atomic), then register it."""
        path = self.folder / f"part-{uuid.uuid4().hex}.parquet"
        Store.write_parquet(table, path)
        if self.store is not None:
            self.store.record_part(path)

    def read(self, keys: list[str]) -> pa.Table:
        """Rows whose key is in ``keys`` (keys absent from the cache are absent), in part order.

        The key columns are matched in one pass over all parts, and only parts holding a wanted row are read
        whole: the time grows with the cache's keys plus the rows read, not with parts × wanted keys.
        """
        parts, cols = self._key_columns()
        hit = np.zeros(0, dtype=np.int64)
        if cols and keys:
            all_keys = pa.concat_arrays(cols).cast(pa.string())
            value_set = pa.array(list(set(keys)), type=pa.string())
            hit = np.flatnonzero(pa.compute.is_in(all_keys, value_set=value_set).to_numpy(zero_copy_only=False))
        if not hit.size:
            raise StoreError(f"row cache {self.folder} holds none of the requested keys")
        sizes = [len(c) for c in cols]
        part_of = np.repeat(np.arange(len(parts)), sizes)[hit]
        # a key computed twice (two racing runs) is taken from the first part holding it, with all its rows there
        hit_keys = all_keys.take(pa.array(hit)).to_numpy(zero_copy_only=False)
        first = pd.Series(part_of).groupby(hit_keys).transform("min").to_numpy()
        hit, part_of = hit[part_of == first], part_of[part_of == first]
        starts = np.r_[0, np.cumsum(sizes)]
        tables = []
        for i in np.unique(part_of):  # a part in the older vector layout is brought to the current one
            rows = pa.array(hit[part_of == i] - starts[i])
            try:
                part = pq.read_table(parts[i], memory_map=True, page_checksum_verification=True)
            except (OSError, pa.ArrowException) as err:
                problem = parquet_problem(parts[i])
                if problem is None:
                    raise
                problem = f"is unreadable ({problem})"
                self._drop(parts[i], problem)
                raise DamagedFile(f"row cache part {parts[i]} {problem}") from err
            tables.append(current_layout(part.take(rows)))
        return pa.concat_tables(tables, promote_options="default")


import pyarrow.compute  # noqa: E402  (pa.compute is used above)
