"""Row caches of per-row stages (chunk, ner, embed): ``_rows/<stage>/<param_fp>/part-*.parquet`` under
``artifacts_dir``, each part appended atomically and registered in the catalog with its size and content hash."""
from __future__ import annotations

import hashlib
import logging
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.core.catalog import Catalog
from tasks.core.files import (
    DamagedFile,
    StoreError,
    file_problem,
    first_line,
    parquet_problem,
    quarantine,
    write_parquet,
)
from tasks.core.vectors import current_layout

log = logging.getLogger("dagrag")


class Once:
    """A per-row stage's input read, made on its first call and kept: ``@Once`` on a stage's local ``read()``.

    Unlike ``functools.cache`` on a local function, it pickles (with what it has read), so the compute closures
    that call it travel to Dask workers (``runner=dask``)."""

    def __init__(self, fn) -> None:
        self.fn, self.done, self.value = fn, False, None

    def __call__(self):
        if not self.done:
            self.value, self.done = self.fn(), True
        return self.value


def text_key(text: str) -> str:
    """Content key of a text (identical texts share one row in a row cache)."""
    return "txt-" + hashlib.sha1(text.encode()).hexdigest()[:20]



class RowCache:
    """Rows of one per-row stage computed under one param fingerprint: parquet parts, appended atomically.

    A row is addressed by its ``key`` column (a doc id or a text hash), so a grown corpus computes
    only the keys it has not seen and a shrunk one reads fewer.
    """

    def __init__(self, folder: Path, key: str, store: Catalog | None = None) -> None:
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
                    problem = f"is unreadable ({first_line(err)})"
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
        write_parquet(table, path)
        if self.store is not None:
            self.store.record_part(path)

    def read(self, keys: list[str]) -> pa.Table:
        """Rows whose key is in ``keys`` (keys absent from the cache are absent), in part order.

        The key columns are matched in one pass over all parts, and only parts holding a wanted row are read
        whole: the time grows with the cache's keys plus the rows read, not with parts × wanted keys.
        """
        return pa.concat_tables(list(self.read_parts(keys)), promote_options="default")

    def read_parts(self, keys: list[str]) -> Iterator[pa.Table]:
        """:meth:`read`'s rows one part at a time, in the same order: a stage that streams its output holds one
        part, not the whole cache (``tasks.core.files.TableStream``)."""
        parts, cols = self._key_columns()
        hit = np.zeros(0, dtype=np.int64)
        if cols and keys:
            all_keys = pa.concat_arrays(cols).cast(pa.string())
            value_set = pa.array(list(set(keys)), type=pa.string())
            hit = np.flatnonzero(pc.is_in(all_keys, value_set=value_set).to_numpy(zero_copy_only=False))
        if not hit.size:
            raise StoreError(f"row cache {self.folder} holds none of the requested keys")
        sizes = [len(c) for c in cols]
        part_of = np.repeat(np.arange(len(parts)), sizes)[hit]
        # a key computed twice (two racing runs) is taken from the first part holding it, with all its rows there
        hit_keys = all_keys.take(pa.array(hit)).to_numpy(zero_copy_only=False)
        first = pd.Series(part_of).groupby(hit_keys).transform("min").to_numpy()
        hit, part_of = hit[part_of == first], part_of[part_of == first]
        starts = np.r_[0, np.cumsum(sizes)]
        return self._take_parts(parts, hit, part_of, starts)

    def _take_parts(self, parts: list[Path], hit: np.ndarray, part_of: np.ndarray, starts: np.ndarray
                    ) -> Iterator[pa.Table]:
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
            yield current_layout(part.take(rows))
