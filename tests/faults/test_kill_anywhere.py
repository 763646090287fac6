"""Kill-anywhere: the real ``dagrag index`` in a subprocess, SIGKILLed at points spread over its run (at catalog
write statements, through the catalog's fault hook, and after a delay), must leave a store that the next run
finishes to the metrics of a clean run with no manual step, and that ``dagrag doctor`` describes truly: no damage,
every recorded stage whole. A store that an older dagrag left with a stage recorded in part (before records were
one transaction) is found by the next run and by the doctor, and repaired by both."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.core.catalog import FAULT_KILL_AT_WRITE, FAULT_TRACE
from tests.faults.conftest import SMALL
from tests.flows.conftest import make_config

REPO = Path(__file__).resolve().parents[2]
INDEX = ("index", "method=bm25", *SMALL)
# what differs between two runs of the same work: times, ids, where the store is, what was computed this time
_RUN_KEYS = ("seconds", "_ms", "run_id", "stages_computed", "rss", "overrides")


def outcome(metrics: dict) -> dict:
    """The metrics a run must give again on a store that lived through a kill (every measured number, also inside
    nested groups; times, ids and what was computed this time left out)."""
    return {k: outcome(v) if isinstance(v, dict) else v for k, v in metrics.items()
            if not any(part in k for part in _RUN_KEYS)}


def index(artifacts: Path, **env: str) -> subprocess.CompletedProcess:
    from prefect.settings import PREFECT_API_URL

    return subprocess.run([sys.executable, "-m", "flows.cli", *INDEX, f"artifacts_dir={artifacts}"], cwd=REPO,
                          env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), **env},
                          capture_output=True, text=True, timeout=300)


def evaluate(artifacts: Path) -> dict:
    from flows.commands.evaluate import evaluate_flow

    cfg = make_config(artifacts.parent, "method=bm25", *SMALL)
    return evaluate_flow(cfg, str(artifacts.parent / "run"))


def records(artifacts: Path) -> dict[str, set[str]]:
    """``{stage: names of its recorded outputs}`` of the store's catalog."""
    from tasks.core.store import Store

    found: dict[str, set[str]] = {}
    for stage, name in Store(artifacts).query("SELECT stage, name FROM stages").itertuples(index=False):
        found.setdefault(stage, set()).add(name)
    return found


def assert_doctor_tells_the_truth(artifacts: Path, clean: dict[str, set[str]]) -> None:
    """The doctor finds no damage after a kill, and every stage the catalog holds is recorded whole: with the
    outputs the same stage has in a clean store."""
    from tasks.core.doctor import examine

    findings, _ = examine(artifacts, repair=False)
    assert not [f for f in findings if f.damage], findings
    for stage, names in records(artifacts).items():
        assert names == clean[stage], (stage, names)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A clean index run with its catalog writes traced, the clean store's records, the metrics of an evaluate
    over it, and a copy of the store as the index run left it (before that evaluate)."""
    root = tmp_path_factory.mktemp("clean")
    trace = root / "writes.txt"
    done = index(root / "artifacts", **{FAULT_TRACE: str(trace)})
    assert done.returncode == 0, done.stderr[-3000:]
    writes = [line.split("\t", 1) for line in trace.read_text().splitlines()]
    indexed = root / "indexed"
    shutil.copytree(root / "artifacts", indexed)  # what `dagrag index` leaves, for the test that breaks a record
    return writes, records(root / "artifacts"), outcome(evaluate(root / "artifacts")), indexed


def kill_points(writes: list[list[str]]) -> list[int]:
    """Write statements to kill at, a handful spread over the run and through the first stage's record: a statement
    inside ``ingest``'s record (some outputs inserted, not all), its COMMIT, the moment after it, and the last write
    (the run's end). The slow test kills at every one."""
    insert = [int(n) for n, sql in writes if sql.startswith("INSERT INTO stages")]
    commits = [int(n) for n, sql in writes if sql == "COMMIT" and int(n) > insert[0]]
    return sorted({insert[1], commits[0], commits[0] + 1, int(writes[-1][0])})


def _killed_at(artifacts: Path, point: int) -> None:
    killed = index(artifacts, **{FAULT_KILL_AT_WRITE: str(point)})
    assert killed.returncode == -signal.SIGKILL, (point, killed.returncode, killed.stderr[-2000:])


def test_a_kill_at_catalog_writes_leaves_a_store_the_next_run_finishes(reference, tmp_path):
    writes, clean_records, clean, _ = reference
    points = kill_points(writes)
    for point in points:
        artifacts = tmp_path / f"at-{point}" / "artifacts"
        _killed_at(artifacts, point)
        assert_doctor_tells_the_truth(artifacts, clean_records)
        assert outcome(evaluate(artifacts)) == clean, point
    print(f"kill points tried: {len(points)} of {len(writes)} catalog writes: {points}")


def test_a_stage_an_older_dagrag_recorded_in_part_is_computed_again_and_repaired(reference, tmp_path, capsys):
    """What the issue met: ``ingest`` recorded with ``documents`` alone (the old writer killed between its
    statements, and no declared outputs on its rows). The next run sees the incomplete record and computes the
    stage again; the doctor reports it (exit 1), and its repair drops the record and quarantines the outputs the
    record lost."""
    from flows.commands.doctor import doctor
    from tasks.core.store import Store

    _, _, clean, indexed = reference
    artifacts = tmp_path / "artifacts"
    shutil.copytree(indexed, artifacts)  # a store `dagrag index` left (as index(artifacts) would, one process less)
    store = Store(artifacts)

    def break_ingest() -> None:
        with store.writing() as con:
            con.execute("UPDATE stages SET outputs = NULL")
            con.execute("DELETE FROM stages WHERE stage = 'ingest' AND name <> 'documents'")

    whole = records(artifacts)["ingest"]  # what ingest declares (documents, questions, gold, …)
    assert {"documents", "questions", "gold", "ingest_report"} <= whole
    break_ingest()
    assert doctor(artifacts, repair=False) == 1
    out = capsys.readouterr()
    assert "stage record" in out.out and "incomplete" in out.out and "questions-" in out.out, out.out
    assert outcome(evaluate(artifacts)) == clean  # no manual step
    assert records(artifacts)["ingest"] == whole

    break_ingest()
    assert doctor(artifacts, repair=True) == 0
    out = capsys.readouterr().out
    assert "record removed" in out and out.count("quarantined to") == len(whole) - 1, out
    assert "ingest" not in records(artifacts)
    assert doctor(artifacts, repair=False) == 0
    assert outcome(evaluate(artifacts)) == clean


@pytest.mark.slow
def test_a_kill_at_every_catalog_write_and_after_delays(reference, tmp_path):
    """Every catalog write statement of the run, then kills after delays spread over the run's length."""
    writes, clean_records, clean, _ = reference
    for point in range(1, len(writes) + 1):
        artifacts = tmp_path / f"at-{point}" / "artifacts"
        _killed_at(artifacts, point)
        assert_doctor_tells_the_truth(artifacts, clean_records)
        assert outcome(evaluate(artifacts)) == clean, point
        print(f"killed at catalog write {point} of {len(writes)}: the next run gave the clean metrics", flush=True)
    t0 = time.monotonic()
    assert index(tmp_path / "timed" / "artifacts").returncode == 0
    length = time.monotonic() - t0
    from prefect.settings import PREFECT_API_URL

    delays = [length * i / 12 for i in range(1, 12)]
    for i, delay in enumerate(delays):
        artifacts = tmp_path / f"after-{i}" / "artifacts"
        proc = subprocess.Popen([sys.executable, "-m", "flows.cli", *INDEX, f"artifacts_dir={artifacts}"], cwd=REPO,
                                env={**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.kill()
        proc.wait(timeout=60)
        if artifacts.exists():
            assert_doctor_tells_the_truth(artifacts, clean_records)
        assert outcome(evaluate(artifacts)) == clean, delay
        print(f"killed after {delay:.1f} s of a {length:.1f} s run: the next run gave the clean metrics", flush=True)
    print(f"kill points tried: {len(writes)} catalog writes and {len(delays)} delays")
