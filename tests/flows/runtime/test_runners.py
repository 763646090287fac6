"""flows.runtime.runners: runner=dask gives what runner=thread gives (the same stage fingerprints and rows), and partitions."""
from __future__ import annotations

import asyncio

import pandas as pd
import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from flows.runtime.config import with_runner
from flows.runtime.pipeline import index_flow
from tasks.core.stage import partition_plan
from tasks.core.store import Store
from tests.flows.conftest import make_config

pytest.importorskip("prefect_dask")

# 24 passages in partitions of 10 rows: 3 partitions of documents, more of chunks
SMALL = ["method=zoomrag", "dataset=sample", "dataset.n_passages=24", "dataset.n_questions=4",
         "runner.partition_rows=10"]


def test_partition_plan_covers_the_rows_in_order():
    assert partition_plan(40, 16) == [(0, 16), (16, 32), (32, 40)]
    assert partition_plan(5, 0) == [(0, 5)]
    assert partition_plan(0, 16) == []


def catalog(root) -> pd.DataFrame:
    return Store(root).query("SELECT stage, name, fp, rows, path FROM stages ORDER BY stage, name")


def test_dask_runner_matches_thread_runner(tmp_path, count_submissions):
    thread = make_config(tmp_path / "thread", *SMALL, "runner=thread")
    dask = make_config(tmp_path / "dask", *SMALL, "runner=dask", "runner.n_workers=2")
    with_runner(index_flow, thread)(thread)
    result = with_runner(index_flow, dask)(dask)
    submitted = len(count_submissions)
    a, b = catalog(thread["artifacts_dir"]), catalog(dask["artifacts_dir"])
    assert a[["stage", "name", "fp", "rows"]].equals(b[["stage", "name", "fp", "rows"]])
    for pa_, pb in zip(a["path"], b["path"]):
        pd.testing.assert_frame_equal(Store.read(pa_), Store.read(pb), check_exact=True)
    # the per-row stages really were partitioned and computed on the workers
    assert result["rows_computed"]["ner"] == 24
    assert set(Store(dask["artifacts_dir"]).events(result["run_id"])["status"]) == {"computed"}
    assert submitted >= 3 + 3 + 3  # ner, chunk and the passages' embed in 3 partitions each, and the chunks'
    progress = [a for a in asyncio.run(artifacts(result["run_id"])) if a.type == "progress"]
    assert progress and all(a.data == 100.0 for a in progress)  # the UI's progress bar of each partitioned stage


async def artifacts(flow_run_id):
    async with get_client() as client:
        return await client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


def test_an_existing_scheduler_is_used_by_address(tmp_path):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as watcher:
        cfg = make_config(tmp_path, "dataset=sample", "dataset.n_passages=40", "dataset.n_questions=4",
                          "method=dense", "runner=dask", f"runner.address={cluster.scheduler_address}",
                          "runner.partition_rows=16")
        result = with_runner(index_flow, cfg)(cfg)
        assert result["rows_computed"]["embed"] == 40
        prefixes = watcher.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.task_prefixes))
        assert any(p.startswith("embed") for p in prefixes), prefixes  # this scheduler ran the partitions
