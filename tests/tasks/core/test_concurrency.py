"""Concurrent runs on one ``artifacts_dir``: a stage is computed once (the second run waits, then
reuses it), a failed or killed holder lets the waiter compute, row caches survive racing appends,
and the catalog survives a program outside dagrag holding DuckDB's lock."""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

import tasks.core.catalog as catalog_mod
from tasks.core.files import CATALOG, StoreError
from tasks.core.hashing import fingerprint
from tasks.core.locks import stage_lock
from tasks.core.stage import RunContext, run_named_row_stage, run_named_stage
from tasks.core.store import Store

REPO = Path(__file__).resolve().parents[3]
STAGE, CODE, PARAMS, INPUTS = "slow", "code-v1", {"p": 1}, {"in": "abc"}
FP = fingerprint(STAGE, CODE, PARAMS, INPUTS)

# A run of stage "slow" whose compute appends its tag to a counter file, then holds until the test
# creates <gate>/release (so the test decides when it finishes, with no timing assumptions).
_RUN = """
import json, logging, pathlib, sys, time
import pandas as pd
from tasks.core.stage import RunContext, run_named_stage

logging.basicConfig(level=logging.INFO, format="%(message)s")
art, gate, tag, mode = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4]

def compute():
    with open(gate / "counter", "a") as f:
        f.write(tag + "\\n")
    (gate / f"started-{tag}").touch()
    deadline = time.monotonic() + 60
    while not (gate / "release").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    if mode == "raise":
        raise RuntimeError(f"compute failed in {tag}")
    return {"out": pd.DataFrame({"x": [1, 2, 3]}), "blob": b"abc"}, 3

while not (gate / "go").exists():
    time.sleep(0.01)
refs = run_named_stage(RunContext(art, "ds", tag), "slow", "code-v1", {"p": 1}, {"in": "abc"}, compute,
                 ext={"blob": "bin"})
print(json.dumps({k: [v.path, v.fp, v.rows] for k, v in sorted(refs.items())}))
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


class _Run:
    """One ``_RUN`` subprocess, its stdout/stderr in files."""

    def __init__(self, tmp: Path, tag: str, mode: str = "ok") -> None:
        script = tmp / "run.py"
        if not script.exists():
            script.write_text(textwrap.dedent(_RUN))
        self.tag, self.out, self.err = tag, tmp / f"{tag}.out", tmp / f"{tag}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, str(script), str(tmp / "art"), str(tmp), tag, mode],
                                         cwd=REPO, env=_env(), stdout=out, stderr=err)

    def stderr(self) -> str:
        return self.err.read_text()

    def finish(self, ok: bool = True) -> dict:
        self.proc.wait(timeout=120)
        if ok:
            assert self.proc.returncode == 0, self.stderr()[-3000:]
            return json.loads(self.out.read_text())
        return {}


def _wait_until(cond, runs: list[_Run], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for r in runs:
            if r.proc.poll() is not None:
                raise AssertionError(f"{r.tag} exited before {what}: {r.stderr()[-3000:]}")
        if time.monotonic() > deadline:
            for r in runs:
                r.proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _waiting_line(pid: int) -> str:
    return f"waiting for {STAGE} [{FP}], being computed by another run (pid {pid})"


def _counter(tmp: Path) -> list[str]:
    return (tmp / "counter").read_text().split()


def _statuses(store: Store, run_id: str) -> list[str]:
    return store.events(run_id)["status"].tolist()


# ----------------------------------------------------------------------------- two processes

def test_two_processes_compute_a_stage_once(tmp_path):
    runs = [_Run(tmp_path, "p1"), _Run(tmp_path, "p2")]
    (tmp_path / "go").touch()  # both look the stage up at once
    _wait_until(lambda: any((tmp_path / f"started-{r.tag}").exists() for r in runs), runs, "a compute")
    first = next(r for r in runs if (tmp_path / f"started-{r.tag}").exists())
    second = next(r for r in runs if r is not first)
    _wait_until(lambda: _waiting_line(first.proc.pid) in second.stderr(), runs, "the second run to wait")
    (tmp_path / "release").touch()
    got = [r.finish() for r in runs]

    assert _counter(tmp_path) == [first.tag]  # computed once
    assert got[0] == got[1] and set(got[0]) == {"blob", "out"}
    assert Store.read(got[0]["out"][0])["x"].tolist() == [1, 2, 3]
    assert Path(got[0]["blob"][0]).read_bytes() == b"abc"
    store = Store(tmp_path / "art")
    assert _statuses(store, first.tag) == ["computed"]
    assert _statuses(store, second.tag) == ["cached"]
    assert store.query("SELECT count(DISTINCT fp) AS n FROM stages WHERE stage = 'slow'")["n"].iloc[0] == 1
    assert list((tmp_path / "art" / "_locks").iterdir()) == []  # released and removed


def test_failed_holder_releases_the_lock_and_the_waiter_computes(tmp_path):
    (tmp_path / "go").touch()
    failing = _Run(tmp_path, "fails", mode="raise")
    _wait_until(lambda: (tmp_path / "started-fails").exists(), [failing], "the failing compute")
    waiter = _Run(tmp_path, "waits")
    _wait_until(lambda: _waiting_line(failing.proc.pid) in waiter.stderr(), [failing, waiter], "the waiter")
    (tmp_path / "release").touch()
    failing.finish(ok=False)
    assert failing.proc.returncode != 0 and "compute failed in fails" in failing.stderr()
    got = waiter.finish()

    assert _counter(tmp_path) == ["fails", "waits"]  # the waiter computed it itself
    assert Store.read(got["out"][0])["x"].tolist() == [1, 2, 3]
    store = Store(tmp_path / "art")
    assert _statuses(store, "waits") == ["computed"] and _statuses(store, "fails") == []
    assert list((tmp_path / "art" / "_locks").iterdir()) == []


def test_killed_holder_releases_the_lock(tmp_path):
    (tmp_path / "go").touch()
    killed = _Run(tmp_path, "killed")
    _wait_until(lambda: (tmp_path / "started-killed").exists(), [killed], "the compute")
    waiter = _Run(tmp_path, "waits")
    _wait_until(lambda: _waiting_line(killed.proc.pid) in waiter.stderr(), [killed, waiter], "the waiter")
    os.kill(killed.proc.pid, signal.SIGKILL)  # the OS releases its flock; its lock file stays behind
    killed.proc.wait(timeout=30)
    (tmp_path / "release").touch()
    got = waiter.finish()

    assert _counter(tmp_path) == ["killed", "waits"]
    assert Store.read(got["out"][0])["x"].tolist() == [1, 2, 3]
    assert _statuses(Store(tmp_path / "art"), "waits") == ["computed"]
    assert list((tmp_path / "art" / "_locks").iterdir()) == []  # the stale file was taken over, then removed


# ----------------------------------------------------------------------------- the lock itself

def test_stage_lock_waits_names_the_holder_and_times_out(tmp_path):
    store = Store(tmp_path)
    path = tmp_path / "_locks" / "a_b-fp1.lock"
    seen: list[int | None] = []
    with stage_lock(store.root, "a/b", "fp1"):
        assert path.read_text().strip() == str(os.getpid())
        with pytest.raises(StoreError, match=r"a/b \[fp1\].*pid"):
            with stage_lock(store.root, "a/b", "fp1", on_wait=seen.append, timeout_s=0.3, poll_s=0.02):
                pass  # pragma: no cover - never reached
        assert seen == [os.getpid()]  # told once, with the holder's pid
        with stage_lock(store.root, "a/b", "other-fp", on_wait=seen.append, timeout_s=0.3):
            pass  # another fingerprint is not blocked
    assert not path.exists()
    with stage_lock(store.root, "a/b", "fp1", on_wait=seen.append, timeout_s=0.3):
        pass
    assert seen == [os.getpid()]


def test_stage_lock_released_on_exception(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(ValueError):
        with stage_lock(store.root, "s", "fp"):
            raise ValueError("boom")
    seen: list[int | None] = []
    with stage_lock(store.root, "s", "fp", on_wait=seen.append, timeout_s=0.3):
        pass
    assert seen == []


def test_stage_lock_waiter_follows_a_removed_file(tmp_path):
    """A waiter that opened the lock file before the holder removed it locks the new file, and the
    next run cannot enter while it holds it."""
    store = Store(tmp_path)
    inside, release, results = threading.Event(), threading.Event(), []

    def waiter():
        with stage_lock(store.root, "s", "fp", timeout_s=30, poll_s=0.01):
            inside.set()
            release.wait(30)

    with stage_lock(store.root, "s", "fp"):
        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.2)  # the waiter now holds an open descriptor on the file about to be removed
    assert inside.wait(30)
    with pytest.raises(StoreError):
        with stage_lock(store.root, "s", "fp", on_wait=results.append, timeout_s=0.2, poll_s=0.02):
            pass  # pragma: no cover - never reached
    assert results == [os.getpid()]
    release.set()
    t.join(30)


def test_threads_compute_a_stage_once(tmp_path, caplog):
    """Prefect's thread pool: two tasks of one process running the same stage also compute it once."""
    caplog.set_level(logging.INFO, logger="dagrag")
    release, calls = threading.Event(), []

    def compute():
        calls.append(threading.current_thread().name)
        assert release.wait(30)
        return {"out": pd.DataFrame({"x": [7]})}, 1

    results: dict[str, dict] = {}

    def run(tag):
        results[tag] = run_named_stage(RunContext(str(tmp_path), "ds", tag), STAGE, CODE, PARAMS, INPUTS, compute)

    threads = [threading.Thread(target=run, args=(t,), name=t) for t in ("t1", "t2")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while not any("being computed by another run" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, "no thread waited"
        time.sleep(0.01)
    release.set()
    for t in threads:
        t.join(30)
    assert len(calls) == 1 and results["t1"] == results["t2"]
    store = Store(tmp_path)
    assert sorted(_statuses(store, "t1") + _statuses(store, "t2")) == ["cached", "computed"]


# ----------------------------------------------------------------------------- row caches

def test_row_stage_racing_appends_of_the_same_keys(tmp_path):
    """Two runs of a per-row stage with different inputs (so different fingerprints, no shared stage
    lock) compute overlapping keys at the same moment: both succeed, every key is read once."""
    barrier = threading.Barrier(2, timeout=30)
    results: dict[str, pd.DataFrame] = {}

    def compute_rows(missing):
        barrier.wait()  # both have found the same keys missing before either appends
        return pa.table({"key": missing, "v": [f"{k}-v" for k in missing]})

    def run(tag, keys):
        def assemble(rows):
            return {"rows": rows.to_pandas().sort_values("key").reset_index(drop=True)}

        refs = run_named_row_stage(RunContext(str(tmp_path), "ds", tag), "rowst", "c1", {}, {"m": 1},
                             {"docs": tag}, pd.Series(keys), compute_rows, "key", assemble)
        results[tag] = Store.read(refs["rows"])

    threads = [threading.Thread(target=run, args=("r1", ["a", "b", "c"])),
               threading.Thread(target=run, args=("r2", ["b", "c", "d"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results["r1"]["key"].tolist() == ["a", "b", "c"]
    assert results["r2"]["key"].tolist() == ["b", "c", "d"]
    assert (results["r1"]["v"] == results["r1"]["key"] + "-v").all()
    parts = list((tmp_path / "_rows" / "rowst").rglob("part-*.parquet"))
    assert len(parts) == 2  # b and c were computed twice, in two parts
    cache = Store(tmp_path).row_cache("rowst", parts[0].parent.name, "key")
    both = cache.read(["a", "b", "c", "d"]).to_pandas()
    assert sorted(both["key"]) == ["a", "b", "c", "d"]  # each key once: the first part holding it


# ----------------------------------------------------------------------------- the catalog

_HOLD_CATALOG = """
import pathlib, sys, time
import duckdb
con = duckdb.connect(sys.argv[1])  # DuckDB's own lock, outside dagrag's file lock (a duckdb shell)
con.execute("SELECT count(*) FROM stages").fetchall()
print("held", flush=True)
release = pathlib.Path(sys.argv[2])
deadline = time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.02)
con.close()
print("released", flush=True)
"""


def _hold_catalog(tmp_path: Path, release: Path) -> subprocess.Popen:
    Store(tmp_path / "art").query("SELECT 1")  # create the catalog
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_HOLD_CATALOG),
                             str(tmp_path / "art" / CATALOG), str(release)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held", proc.stderr.read()
    return proc


def test_catalog_open_retries_while_another_program_holds_it(tmp_path, monkeypatch):
    release = tmp_path / "release"
    proc = _hold_catalog(tmp_path, release)
    attempts = []
    attach = catalog_mod._attach

    def counting(*args, **kwargs):
        attempts.append(1)
        if len(attempts) == 2:
            release.touch()  # let the holder go after one refused attempt
        return attach(*args, **kwargs)

    monkeypatch.setattr(catalog_mod, "_attach", counting)
    monkeypatch.setattr(catalog_mod, "CATALOG_OPEN_TIMEOUT_S", 60.0)
    store = Store(tmp_path / "art")
    store.event("r", "s", "fp", "ds", "cached", rows=1, rows_computed=0, seconds=0.0, peak_rss_mb=0.0)
    assert proc.communicate(timeout=30)[0].strip() == "released"
    assert len(attempts) >= 2
    assert _statuses(store, "r") == ["cached"]


def test_catalog_open_gives_up_with_a_clear_error(tmp_path, monkeypatch):
    release = tmp_path / "release"
    proc = _hold_catalog(tmp_path, release)
    monkeypatch.setattr(catalog_mod, "CATALOG_OPEN_TIMEOUT_S", 0.3)
    try:
        with pytest.raises(StoreError, match=r"held by another program.*duckdb shell"):
            Store(tmp_path / "art").query("SELECT 1")
    finally:
        release.touch()
        proc.communicate(timeout=30)
    assert Store(tmp_path / "art").query("SELECT 1 AS one")["one"].tolist() == [1]
