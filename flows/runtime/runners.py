"""The Prefect task runners of ``runner/``: where independent stages and per-row partitions run.

Both keep every stage in the flow process, so the catalog and the row caches have one writer. They differ
in where a per-row stage's partitions (row ranges of its rows still to compute, ``runner.partition_rows``
each; :func:`tasks.core.stage.compute_partitions`) are computed:

- ``runner=thread``: in the flow process, one after another.
- ``runner=dask``: on Dask workers of the cluster that ``prefect_dask.DaskTaskRunner`` starts (a
  ``distributed.LocalCluster`` of ``runner.n_workers`` processes) or connects to (``runner.address``). A
  worker returns its rows; the flow process appends them to the row cache and records the stage.
"""
from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Callable

from prefect.task_runners import ThreadPoolTaskRunner


class PartitionedThreadRunner(ThreadPoolTaskRunner):
    """Independent stages in threads; per-row partitions computed here, in order."""

    def __init__(self, max_workers: int, partition_rows: int) -> None:
        super().__init__(max_workers=max_workers)
        self.partition_rows = partition_rows

    def duplicate(self) -> "PartitionedThreadRunner":
        return type(self)(self._max_workers, self.partition_rows)


class DaskPartitionRunner(PartitionedThreadRunner):
    """Independent stages in threads of the flow process; per-row partitions on Dask workers."""

    def __init__(self, max_workers: int, partition_rows: int, address: str | None = None, n_workers: int = 2,
                 threads_per_worker: int = 1) -> None:
        super().__init__(max_workers, partition_rows)
        self.address, self.n_workers, self.threads_per_worker = address, n_workers, threads_per_worker
        self._dask: Any = None

    def duplicate(self) -> "DaskPartitionRunner":
        return type(self)(self._max_workers, self.partition_rows, self.address, self.n_workers,
                          self.threads_per_worker)

    def dask_runner(self) -> Any:
        """``prefect_dask.DaskTaskRunner`` for the configured cluster (not yet started)."""
        from prefect_dask import DaskTaskRunner

        if self.address:
            return DaskTaskRunner(address=self.address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": self.n_workers,
                                              "threads_per_worker": self.threads_per_worker,
                                              "processes": True, "dashboard_address": ":0",
                                              "silence_logs": logging.WARNING})

    def __enter__(self) -> "DaskPartitionRunner":
        super().__enter__()
        # keep the console to the stages' lines: Dask's INFO chatter, here and in the worker processes
        for name in [n for n in logging.root.manager.loggerDict if n.startswith("distributed")] + ["distributed"]:
            logging.getLogger(name).setLevel(logging.WARNING)
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
        self._dask = self.dask_runner().__enter__()
        self._dask.client  # start the cluster now: the property starts it lazily, and not thread-safely
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._dask is not None:
                self._dask.__exit__(*exc)
                self._dask = None
        finally:
            super().__exit__(*exc)

    def submit_partition(self, compute_rows: Callable[[list[str]], Any], keys: list[str], name: str) -> Any:
        """Compute one partition on a Dask worker; a future whose ``.result()`` is its rows.

        A plain Dask task, not a Prefect task run: a worker then needs no Prefect API (a temporary server or a
        remote scheduler's workers could not reach this process's), and progress is reported here, by the flow.
        """
        return self._dask.client.submit(compute_rows, keys, key=f"{name.replace(' ', '-')}-{uuid.uuid4().hex[:8]}",
                                        pure=False)
