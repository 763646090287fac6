"""``dagrag loadtest`` end to end, bounded and small: real servers (batching on and off), rows in the catalog,
its report and ``dagrag report``'s serving section."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from flows.runtime.pipeline import index_flow
from flows.commands.loadtest import latest_rows
from tasks.core.store import Store
from tests.flows.conftest import make_config
from tests.flows.serving_helpers import REPO

SAMPLE = ["dataset=sample", "dataset.n_passages=60", "dataset.n_questions=12"]


def test_loadtest_measures_both_modes_and_reports(tmp_path):
    index_flow(make_config(tmp_path, "method=bm25", *SAMPLE))
    store = tmp_path / "artifacts"
    done = subprocess.run([sys.executable, "-m", "flows.cli", "loadtest", *SAMPLE, f"artifacts_dir={store}",
                           "loadtest.setups=['bm25 method=bm25']", "loadtest.concurrency=[1,16]",
                           "loadtest.max_batch=[16,1]", "loadtest.requests=48", "loadtest.duration_s=20",
                           "loadtest.warmup=4"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    last = json.loads(done.stdout.strip().splitlines()[-1].split("loadtest: ", 1)[1])
    rows = latest_rows(Store(store))
    assert len(rows) == 4 and set(zip(rows["max_batch"], rows["clients"])) == {(16, 1), (16, 16), (1, 1), (1, 16)}
    assert (rows["failures"] == 0).all() and (rows["requests"] == 48).all() and (rows["questions_per_s"] > 0).all()
    assert (rows[rows["max_batch"] == 1]["mean_batch"] == 1).all()
    assert rows.loc[(rows["max_batch"] == 16) & (rows["clients"] == 16), "mean_batch"].iloc[0] >= 1
    assert (rows["p50_ms"] <= rows["p99_ms"]).all()
    assert (store / "reports" / "loadtest-sample-60-s0" / "throughput.png").stat().st_size > 5000
    assert "| bm25 | 16 | 16 |" in (store / "reports" / "loadtest-sample-60-s0" / "loadtest.md").read_text()
    assert last["run_id"].startswith("loadtest-")


def test_split_keeps_the_methods_own_part_names_apart():
    """A method's part named like a split column (dense's faiss ``search``) does not overwrite it."""
    from flows.commands.loadtest import split_ms

    before = {"batches": 0, "questions": 0, "queue_wait": 0, "search": 0, "serialise": 0, "part:search": 0}
    after = {"batches": 2, "questions": 4, "queue_wait": 0.004, "search": 0.02, "serialise": 0.0004,
             "part:search": 0.002, "part:query_encoding": 0.016}
    assert split_ms(before, after) == {"mean_batch": 2.0, "queue_wait_ms": 1.0, "search_ms": 5.0, "serialise_ms": 0.1,
                                       "part_query_encoding_ms": 4.0, "part_search_ms": 0.5}


def test_loadtest_reads_its_group_like_every_command():
    """``loadtest.*`` is the ``loadtest/`` config group (conf/loadtest/default.yaml), checked by the same config
    check as every group: limits from the field metadata, unknown keys refused, a setup named then its overrides."""
    import pytest

    from flows.runtime.config import ConfigError, load_config
    from flows.serving.index import compose

    cfg = load_config(compose(["loadtest.setups=['bm25 method=bm25 dataset.n_passages=60']", "loadtest.k=5"]))
    assert cfg.loadtest.setup_overrides() == {"bm25": ("method=bm25", "dataset.n_passages=60")}
    assert cfg.loadtest.k == 5 and cfg.loadtest.concurrency == (1, 8, 64, 256)
    assert list(load_config(compose([])).loadtest.setup_overrides()) == ["dense", "zoomrag", "linearrag", "hybrid"]
    for bad, said in [("loadtest.requests=0", "loadtest.requests=0 is not an int in [1, inf)"),
                      ("loadtest.duration_s=0", "loadtest.duration_s=0 is not a float in (0, inf)"),
                      ("loadtest.setups=['bm25']", "setups entry 'bm25' must be a new name followed by"),
                      ("loadtest.requestz=5", "loadtest.requestz")]:
        with pytest.raises(ConfigError, match=re.escape(said)):
            load_config(compose([bad]))
