"""Tables too big to hold: rows placed by their final position through spill files on disk, and read back in
that order one bucket at a time (an external sort), so a stage that reorders a long corpus holds one bucket."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

RANK = "__rank"


class SpillSort:
    """Rows given in any order with their final position (``rank``, 0..n-1, each once), read back in rank order.

    The ranks are cut into ``buckets`` equal ranges, each one a Parquet file in a temporary folder; :meth:`add`
    appends rows to their buckets' files, :meth:`sorted` reads one bucket at a time, sorts it and yields it. The
    folder is removed when :meth:`sorted` ends, or by :meth:`close`."""

    def __init__(self, n_rows: int, buckets: int, schema: pa.Schema) -> None:
        self.schema = schema.append(pa.field(RANK, pa.int64()))
        self.per_bucket = max(1, -(-n_rows // max(1, buckets)))
        self.n_buckets = max(1, -(-n_rows // self.per_bucket)) if n_rows else 0
        self._dir = tempfile.TemporaryDirectory(prefix="dagrag-spill-")
        self._writers: dict[int, pq.ParquetWriter] = {}

    def _path(self, bucket: int) -> Path:
        return Path(self._dir.name) / f"bucket-{bucket:05d}.parquet"

    def add(self, table: pa.Table, rank: np.ndarray) -> None:
        """Append ``table``'s rows, whose final positions are ``rank``, to their buckets."""
        table = table.select(self.schema.names[:-1]).cast(pa.schema(list(self.schema)[:-1]))
        table = table.append_column(RANK, pa.array(rank, type=pa.int64()))
        bucket = rank // self.per_bucket
        for b in np.unique(bucket):
            writer = self._writers.get(int(b))
            if writer is None:
                writer = self._writers[int(b)] = pq.ParquetWriter(self._path(int(b)), self.schema)
            writer.write_table(table.filter(pa.array(bucket == b)))

    def sorted(self) -> Iterator[pa.Table]:
        """Every row in rank order, one bucket a table (without the rank)."""
        try:
            for writer in self._writers.values():
                writer.close()
            self._writers.clear()
            for b in range(self.n_buckets):
                path = self._path(b)
                if not path.exists():
                    continue
                table = pq.read_table(path)
                yield table.take(pa.array(np.argsort(table.column(RANK).to_numpy()))).drop_columns([RANK])
                path.unlink()
        finally:
            self.close()

    def close(self) -> None:
        """Remove the spill files."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
        self._dir.cleanup()
