"""The stage store: every artifact path, atomic write and catalog row lives here.

Layout under ``artifacts_dir``::

    catalog.duckdb                              the catalog (stages, stage_events, runs, metrics, views)
    _locks/<stage>-<fp>.lock                    held while a process computes that stage (holder's pid inside)
    <dataset>/<stage>/<name>-<fp>.parquet       a stage's outputs, addressed by its fingerprint
    _rows/<stage>/<param_fp>/part-*.parquet     row caches of per-row stages (chunk, ner, embed)
    _quarantine/<when>/<relative path>          damaged files, moved aside (never deleted) by a run or the doctor

A stage's fingerprint is a content hash of (stage name, its code identity
(:mod:`tasks.core.code_identity`), its params (:meth:`tasks.core.stage.StageParams.identity`), its input
fingerprints).
Outputs are written to a temp file and renamed into place; the catalog row is written
last, so a run killed at any point leaves nothing that a later run trusts. The catalog
is opened only for short, file-locked transactions (:mod:`tasks.core.catalog`), so two processes
sharing one ``artifacts_dir`` queue behind each other instead of corrupting it; and a stage being
computed is locked (:func:`tasks.core.locks.stage_lock`), so a second run waits for it and reuses it
instead of computing it again.

Every file a stage or a row cache writes has its size and content hash (BLAKE2b) recorded in the catalog
(``stages.bytes, stages.digest``; ``row_parts``), and Parquet files are written with page checksums. A cached
stage is trusted only after a cheap check (:func:`tasks.core.files.file_problem`: the recorded size, a readable Parquet footer
holding the recorded rows); a non-Parquet file's hash is checked when it is read (:meth:`Store.read_bytes`),
a Parquet page's CRC when the page is read. Full hashes are ``dagrag doctor``'s job (``flows.commands.doctor``).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tasks.core.catalog import Catalog
from tasks.core.files import (
    LINKABLE_SUFFIXES,
    LOCKS,
    ROWS,
    StoreError,
    file_digest,
    file_problem,
    parquet_problem,
    quarantine_damaged,
)
from tasks.core.hashing import json_default
from tasks.core.row_cache import RowCache

log = logging.getLogger("dagrag")


@dataclass(frozen=True)
class ArtifactRef:
    """A small, picklable reference to one stored artifact (what tasks return), with its recorded content hash
    (None: recorded before hashes were)."""

    name: str
    path: str
    fp: str
    rows: int
    digest: str | None = None


def incomplete(fp: str, rows: list[tuple[str, str, str | None]]) -> str | None:
    """Why the catalog record of one stage (its ``(name, path, outputs)`` rows) is not whole, or None.

    A record is whole when it holds every output its stage declared (``outputs``, written on each row since
    records are made in one transaction) and no output file of this fingerprint lies unrecorded beside its
    recorded ones (``<name>-<fp>.<ext>``: outputs are written before their record, so such a file is an output
    a record made before that transaction lost to a kill; the only sign such a record leaves)."""
    names = {name for name, _, _ in rows}
    declared = {n for _, _, d in rows if d is not None for n in json.loads(d)}
    lost = sorted(declared - names)
    folders = {Path(path).parent for _, path, _ in rows}
    recorded = {Path(path).name for _, path, _ in rows}
    lost += sorted(p.name for folder in folders if folder.is_dir() for p in folder.glob(f"*-{fp}.*")
                   if not p.name.startswith(".") and p.name not in recorded)
    if not lost:
        return None
    return f"its record is incomplete ({', '.join(lost)} not recorded: a run was killed while recording it)"


class Store(Catalog):
    """All I/O under ``artifacts_dir``: the catalog (:class:`Catalog`), stage outputs' paths and reads, the
    records of finished stages, row caches, and copies of the whole store."""

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

    # -- paths and reads ----------------------------------------------------------
    def path_for(self, dataset: str, stage: str, name: str, fp: str, ext: str = "parquet") -> Path:
        """Address of a stage output: ``<dataset>/<stage>/<name>-<fp>.<ext>``."""
        return self.root / dataset / stage / f"{name}-{fp}.{ext}"

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
    def keyed(ref: ArtifactRef | str | Path, key: str) -> "KeyedParquet":
        """A Parquet artifact's rows fetched by their ``key`` column a few at a time (:class:`KeyedParquet`)."""
        return KeyedParquet(ref.path if isinstance(ref, ArtifactRef) else str(ref), key)

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
        """Outputs of a finished stage with this fingerprint, if its record is whole (:func:`incomplete`) and every
        file passes the cheap check (:func:`tasks.core.files.file_problem`: there, the recorded size, a readable
        Parquet footer with the recorded rows). A record or file that fails is named in one log line (``warn``),
        and the stage is to be computed again."""
        refs, problem = self.examine_record(stage, fp)
        if problem is not None and warn:
            log.warning("%s [%s]: %s, so the stage is computed again", stage, fp, problem)
        return refs

    def examine_record(self, stage: str, fp: str) -> tuple[dict[str, ArtifactRef] | None, str | None]:
        """``(outputs, None)`` of a recorded stage a run may trust; ``(None, None)`` when none is recorded;
        ``(None, what is wrong)`` when its record is incomplete or one of its files fails the cheap check."""
        with self.catalog() as con:  # plain tuples: a pandas frame per lookup cost more than the query
            rows = con.execute("SELECT name, path, rows, bytes, digest, outputs FROM stages WHERE stage = ? AND fp = ?",
                               [stage, fp]).fetchall()
        if not rows:
            return None, None
        gap = incomplete(fp, [(name, path, declared) for name, path, _, _, _, declared in rows])
        if gap is not None:
            return None, gap
        for _, path, n, size, _, _ in rows:
            problem = file_problem(path, size, n)
            if problem is not None:
                return None, f"{path} {problem}"
        return {name: ArtifactRef(name, path, fp, int(n), digest) for name, path, n, _, digest, _ in rows}, None

    def record(self, stage: str, fp: str, dataset: str, refs: Mapping[str, ArtifactRef], *,
               input_fps: Mapping[str, str], params: Any, rows_computed: int,
               seconds: float, peak_rss_mb: float, run_id: str) -> dict[str, ArtifactRef]:
        """Register a finished stage (called last, after its files are in place), with each file's size and
        content hash; returns ``refs`` with those hashes (what a later lookup returns)."""
        now = dt.datetime.now()
        sums = {name: file_digest(ref.path) for name, ref in refs.items()}
        declared = json.dumps(sorted(refs))  # every output's name on each row: what a whole record holds
        with self.writing() as con:  # one transaction: the stage is recorded whole, or not at all
            con.execute("DELETE FROM stages WHERE stage = ? AND fp = ?", [stage, fp])
            for ref in refs.values():
                con.execute(
                    "INSERT INTO stages (stage, name, fp, dataset, path, input_fps, params, rows, rows_computed, seconds, "
                    "peak_rss_mb, created_at, run_id, bytes, digest, outputs) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [stage, ref.name, fp, dataset, ref.path, json.dumps(dict(input_fps)),
                     json.dumps(params, default=json_default), ref.rows, rows_computed,
                     seconds, peak_rss_mb, now, run_id, *sums[ref.name], declared])
            self._refresh_views(con, {ref.name: ref.path for ref in refs.values()})
        return {name: dataclasses.replace(ref, digest=sums[name][1]) for name, ref in refs.items()}

    # -- row caches (per-row incremental stages) ----------------------------------
    def row_cache(self, stage: str, param_fp: str, key: str) -> RowCache:
        """The row cache of a per-row stage under these params (shared by every dataset and run)."""
        return RowCache(self.root / ROWS / stage / param_fp, key, self)


class KeyedParquet:
    """Rows of a Parquet file fetched by key: the key column is read once, then :meth:`take` reads only the row
    groups holding the wanted rows, each page checked against its CRC (a damaged file is quarantined). A reader of a
    long table holds its keys and the row groups it asked for, not the table."""

    def __init__(self, path: str, key: str) -> None:
        self.path, self.key = path, key
        try:
            # not memory-mapped: the mapping lives as long as the reader, and every page it touched would stay in the
            # process's RSS (a long corpus's whole read table, by the end of ingest's second pass)
            self.file = pq.ParquetFile(path, memory_map=False, page_checksum_verification=True)
            sizes = [self.file.metadata.row_group(i).num_rows for i in range(self.file.num_row_groups)]
            keys = self.file.read(columns=[key]).column(key).to_pylist()
        except (OSError, pa.ArrowException):
            raise self._damaged() from None
        group = np.repeat(np.arange(len(sizes)), sizes)
        within = np.arange(len(keys)) - np.repeat(np.cumsum([0, *sizes])[:-1], sizes).astype(np.int64)
        self.where = {k: (int(g), int(w)) for k, g, w in zip(keys, group, within)}  # a repeated key: its last row

    def _damaged(self) -> Exception:
        problem = parquet_problem(self.path) if os.path.exists(self.path) else None
        return quarantine_damaged(self.path, problem) if problem is not None else StoreError(
            f"{self.path}: cannot be read")

    def take(self, keys: list[str]) -> pa.Table:
        """The rows of ``keys`` (each present), in that order."""
        places = [self.where[k] for k in keys]
        groups = sorted({g for g, _ in places})
        try:
            table = self.file.read_row_groups(groups)
        except (OSError, pa.ArrowException):
            raise self._damaged() from None
        offset = dict(zip(groups, np.cumsum([0, *(self.file.metadata.row_group(g).num_rows for g in groups)])))
        return table.take(pa.array([int(offset[g]) + w for g, w in places], type=pa.int64()))
