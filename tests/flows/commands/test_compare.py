"""flows.commands.compare: several methods on one dataset in one command, shared stages computed once, then the report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tasks.core.store import Store

REPO = Path(__file__).resolve().parents[3]


def test_compare_runs_each_method_once_shares_stages_and_reports(tmp_path):
    art = tmp_path / "artifacts"
    cmd = [sys.executable, "-m", "flows.commands.compare", "compare.methods=[bm25,dense,hybrid]", "dataset.n_passages=80",
           "dataset.n_questions=16", f"artifacts_dir={art}"]
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1].removeprefix("compare: "))
    assert list(result["methods"]) == ["bm25", "dense", "hybrid"] and len(set(result["runs"])) == 3
    assert result["methods"]["hybrid"]["stages_computed"] == 0  # dense's embed and bm25's index, both cached
    events = Store(art).query("SELECT stage, count(*) FILTER (WHERE status = 'computed') AS computed "
                              "FROM stage_events GROUP BY stage")
    assert dict(zip(events["stage"], events["computed"])) == {"ingest": 1, "bm25_index": 1, "embed": 1, "evidence": 1}
    report = Path(result["report"]).read_text()
    assert Path(result["report"]).parent.name == "compare-sample-80-s0"
    assert all(f"| sample-80-s0 | {m} |" in report for m in ["bm25", "dense", "hybrid"])
    assert (Path(result["report"]).parent / "accuracy_latency.png").exists()


def test_compare_refuses_method_overrides(tmp_path):
    cmd = [sys.executable, "-m", "flows.commands.compare", "method.top_k=5", f"artifacts_dir={tmp_path / 'a'}"]
    out = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and "drop the method overrides" in out.stderr
