"""A fresh store equals a long-lived one, metric by metric: ``dagrag compare`` run first by an older version of the
code (``git archive`` of ``DAGRAG_LIVED_FROM``, default ``HEAD~12``, into a temp folder) on a store, then by
today's code on that store, gives every metric (not only recall) that today's code gives on a fresh store. A stage
or row cache that today's code reuses although its output is not what today's code makes (a fingerprint that misses
a change, a row cache keyed too coarsely) shows up as a difference here.

The CI test runs ArchRAG (the method whose summaries and community embeddings came from such row caches) on the
small sample; the slow ones run every method in both experiments, on the sample and on hotpotqa-100."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.conftest import SMALL
from tests.faults.test_kill_anywhere import outcome

REPO = Path(__file__).resolve().parents[2]
LIVED_FROM = os.environ.get("DAGRAG_LIVED_FROM", "HEAD~12")
DATASETS = Path(os.environ.get("DAGRAG_DATA_DIR", REPO.parent / "shared" / "datasets"))
HOTPOT = ("dataset=hipporag", "dataset.name=hotpotqa-100", f"data_dir={DATASETS}")


def older_code(tmp_path_factory) -> Path:
    """The repository at ``LIVED_FROM``, exported into a temp folder (skipped where git or that commit is not
    there, as in a shallow clone)."""
    where = tmp_path_factory.mktemp("older-code")
    try:
        archive = subprocess.run(["git", "archive", LIVED_FROM], cwd=REPO, capture_output=True, timeout=120)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if archive.returncode != 0:
        pytest.skip(f"cannot export {LIVED_FROM}: {archive.stderr.decode()[:200]}")
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return where


def compare(code: Path, artifacts: Path, *overrides: str) -> dict[str, dict]:
    """``dagrag compare`` by the code at ``code`` on ``artifacts``: ``{method: its metrics}`` from the catalog."""
    from prefect.settings import PREFECT_API_URL

    done = subprocess.run([sys.executable, "-m", "flows.cli", "compare", *overrides, f"artifacts_dir={artifacts}"],
                          cwd=code, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "PYTHONPATH": str(code), "PREFECT_API_URL": PREFECT_API_URL.value()})
    assert done.returncode == 0, (code, done.stderr[-3000:])
    return catalog_metrics(artifacts, json.loads(done.stdout.splitlines()[-1].split(": ", 1)[1])["runs"])


def compare_today(artifacts: Path, *overrides: str) -> dict[str, dict]:
    """What :func:`compare` gives for today's code, in this process: the command's own flow
    (:func:`flows.commands.compare.compare_flow`) over the configs its entry point composes, without the time a
    fresh interpreter spends importing them. Nothing that reaches the store is kept in memory between two calls
    (the process-wide caches hold loaded models and code fingerprints, the same for any store)."""
    from flows.commands.compare import compare_flow
    from tests.flows.conftest import make_config

    at = f"artifacts_dir={artifacts}"
    plain = make_config(artifacts.parent, at, *overrides)
    own = ("compare.", "report.")  # the command's own groups, as flows.commands.compare.main splits them
    rest = [o for o in overrides if not o.split("=", 1)[0].lstrip("+~").startswith(own)]
    configs = {m: make_config(artifacts.parent, at, *rest, f"method={m}") for m in plain["compare"]["methods"]}
    report_cfg = {**plain, "report": {**plain["report"], "name": "compare", "sweep": None}}
    runs = compare_flow(configs, str(artifacts.parent / f"{artifacts.name}-runs"), report_cfg)["runs"]
    return catalog_metrics(artifacts, runs)


def catalog_metrics(artifacts: Path, runs: list[str]) -> dict[str, dict]:
    """``{method: its metrics}`` of these runs, from the store's catalog."""
    from tasks.core.store import Store

    marks = ",".join("?" * len(runs))
    rows = Store(artifacts).query(f"SELECT method, metrics FROM metrics WHERE run_id IN ({marks})", runs)
    return {method: json.loads(metrics) for method, metrics in rows.itertuples(index=False)}


def assert_fresh_equals_lived(tmp_path_factory, *overrides: str) -> None:
    old = older_code(tmp_path_factory)
    root = tmp_path_factory.mktemp("stores")
    lived, fresh = root / "lived", root / "fresh"
    compare(old, lived, *overrides)  # the store lives through the older code first
    today_on_lived = compare_today(lived, *overrides)
    today_on_fresh = compare_today(fresh, *overrides)
    assert today_on_lived.keys() == today_on_fresh.keys()
    differ = {m: {k: (today_on_lived[m].get(k), v) for k, v in outcome(today_on_fresh[m]).items()
                  if outcome(today_on_lived[m]).get(k) != v} for m in today_on_fresh}
    assert not any(differ.values()), {m: d for m, d in differ.items() if d}


def test_archrag_on_a_store_that_lived_through_older_code_equals_a_fresh_one(tmp_path_factory):
    assert_fresh_equals_lived(tmp_path_factory, *SMALL, "compare.methods=[archrag]")


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["paper", "beyond_paper"])
def test_every_method_on_the_sample_fresh_equals_lived(tmp_path_factory, experiment):
    assert_fresh_equals_lived(tmp_path_factory, "dataset=sample", f"experiment={experiment}")


@pytest.mark.slow
@pytest.mark.parametrize("experiment", ["paper", "beyond_paper"])
def test_every_method_on_hotpotqa_100_fresh_equals_lived(tmp_path_factory, experiment):
    if not (DATASETS / "hotpotqa-100").is_dir():
        pytest.skip(f"no hotpotqa-100 under {DATASETS} (set DAGRAG_DATA_DIR)")
    assert_fresh_equals_lived(tmp_path_factory, *HOTPOT, f"experiment={experiment}")
