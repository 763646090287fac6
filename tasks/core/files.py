"""The files of the stage store: their layout names, atomic writes, the cheap and full checks, and the quarantine.

Every file is written to a temp file beside its place and renamed into place (:func:`write_parquet`,
:func:`write_bytes`), so a run killed at any point leaves no half-written file under its real name. Parquet files
are written with page checksums. A file that fails a check when read is moved to ``_quarantine`` (never deleted).
"""
from __future__ import annotations

import datetime as dt
import errno
import hashlib
import os
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

CATALOG = "catalog.duckdb"
CATALOG_LOCK = ".catalog.lock"
LOCKS = "_locks"
ROWS = "_rows"
QUARANTINE = "_quarantine"
# files that are written once (temp file + rename) and never changed: a copy of the store may hard-link them
LINKABLE_SUFFIXES = frozenset({".parquet", ".npy", ".bin", ".tar"})
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


class DamagedFile(StoreError):
    """A stored file failed its check when read; it has been moved to the quarantine."""


def disk_error(err: OSError, path: str | os.PathLike | None = None) -> StoreError | None:
    """A one-line :class:`StoreError` naming the path and the fix for a full, read-only or forbidden disk;
    None for any other OS error."""
    if err.errno not in DISK_ERRORS:
        return None
    what, fix = DISK_ERRORS[err.errno]
    return StoreError(f"{what} writing {err.filename or path}: {fix}")


def first_line(err: BaseException) -> str:
    """The first line of an error's message (its type's name if it has none)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


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
            return f"has no readable Parquet footer ({first_line(err)})"
        if rows is not None and n != rows:
            return f"holds {n} rows, {rows} recorded"
    return None


def parquet_problem(path: str | os.PathLike) -> str | None:
    """What a full read of a Parquet file finds wrong with it (every page decoded, and checked against its CRC
    where it has one), or None."""
    try:
        with pq.ParquetFile(path, memory_map=True, page_checksum_verification=True) as f:
            for i in range(f.num_row_groups):
                f.read_row_group(i)
    except (OSError, pa.ArrowException) as err:
        return first_line(err)
    return None


# ----------------------------------------------------------------------------- atomic writes

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


def write_parquet(table: pd.DataFrame | pa.Table, path: Path) -> int:
    """Write atomically (temp file + rename), with page checksums; returns the row count."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    with _atomic(path) as tmp:
        pq.write_table(table, tmp, write_page_checksum=True)
    return table.num_rows


@dataclass(frozen=True)
class TableStream:
    """A table given as batches, written as they come (:func:`write_parquet_stream`): a stage output that is never
    whole in memory (a long corpus's documents). ``batches`` is called once, when the output is written."""

    schema: pa.Schema
    batches: Callable[[], Iterable[pa.Table]]
    row_group_rows: int = 1024  # small row groups, so a reader can fetch a few rows by their position
    rows: int = -1  # how many rows the batches hold, where known before they are written (-1: not known)

    def __len__(self) -> int:
        if self.rows < 0:
            raise TypeError("a TableStream's length is known once it is written (pass rows= where it is known)")
        return self.rows


def write_parquet_stream(stream: TableStream, path: Path) -> int:
    """Write a :class:`TableStream` atomically (temp file + rename), batch by batch, with page checksums; returns
    the row count. Each batch is cast to the stream's schema, so an all-empty batch keeps the columns' types."""
    rows = 0
    with _atomic(path) as tmp, pq.ParquetWriter(tmp, stream.schema, write_page_checksum=True) as writer:
        for batch in stream.batches():
            writer.write_table(batch.select(stream.schema.names).cast(stream.schema),
                               row_group_size=stream.row_group_rows)
            rows += batch.num_rows
    return rows


def write_bytes(data: bytes, path: Path) -> None:
    """Write a non-tabular artifact atomically."""
    with _atomic(path) as tmp:
        tmp.write_bytes(data)


# ----------------------------------------------------------------------------- the quarantine

def store_root_of(path: str | os.PathLike) -> Path | None:
    """The ``artifacts_dir`` that holds a stage output or row-cache part (the folder with the catalog above it)."""
    for parent in Path(path).resolve().parents:
        if (parent / CATALOG).exists() or (parent / CATALOG_LOCK).exists():
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
