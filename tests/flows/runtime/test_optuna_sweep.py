"""An Optuna sweep (conf/hydra/sweeper/zoomrag.yaml) on the sample dataset: trials that change only retrieval
parameters compute every index stage exactly once, every trial is recorded under one sweep id, and the sweeper
is given the dev-split score."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tasks.core.store import Store

REPO = Path(__file__).resolve().parents[3]
SAMPLE = ["dataset=sample", "dataset.n_passages=80", "dataset.n_questions=16"]


def test_optuna_sweep_reuses_the_index_and_records_its_trials(tmp_path):
    art = tmp_path / "artifacts"
    cmd = [sys.executable, "-m", "flows.commands.evaluate", "-m", "hydra/sweeper=zoomrag", "hydra.sweeper.n_trials=3",
           "method=zoomrag", *SAMPLE, f"artifacts_dir={art}"]
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    store = Store(art)
    trials = store.query("SELECT run_id, metrics FROM metrics WHERE kind = 'evaluate'")
    metrics = [json.loads(m) for m in trials["metrics"]]
    assert len(metrics) == 3
    assert len({m["sweep_id"] for m in metrics}) == 1 and metrics[0]["sweep_id"].startswith("swp-")
    assert sorted(m["sweep_trial"] for m in metrics) == [0, 1, 2]
    assert all(any(o.startswith("method.alpha=") for o in m["sweep_overrides"]) for m in metrics)
    # the index stages: each fingerprint computed by one trial, found cached by the other two
    events = store.query("SELECT stage, fp, count(*) FILTER (WHERE status = 'computed') AS computed, "
                         "count(*) FILTER (WHERE status = 'cached') AS cached FROM stage_events GROUP BY stage, fp")
    assert {"ingest", "ner", "chunk", "embed", "entity_graph", "doc_doc_graph", "global_block"} <= set(events["stage"])
    assert (events["computed"] == 1).all() and (events["cached"] == 2).all(), events
    # Optuna was handed the dev-split objective, never the test split
    best = float(re.search(r"Best value: ([0-9.]+)", out.stdout + out.stderr).group(1))
    assert best == max(m["dev"]["recall@5"] for m in metrics)
    assert all(m["dev"]["n_questions"] + m["test"]["n_questions"] == m["n_questions"] for m in metrics)
