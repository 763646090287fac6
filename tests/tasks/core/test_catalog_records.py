"""A stage record is one catalog transaction: a kill (a real SIGKILL through the catalog's fault hook) or an error at
any statement leaves the stage wholly recorded or not at all; the doctor removes stale temp files of killed writes
and leaves those being written."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tasks.core.catalog import FAULT_KILL_AT_WRITE, FAULT_TRACE
from tasks.core.doctor import STALE_TEMP_S, examine
from tasks.core.files import write_parquet
from tasks.core.store import ArtifactRef, Store

REPO = Path(__file__).resolve().parents[3]
NAMES = ("documents", "questions", "gold", "report")

RECORD = textwrap.dedent("""
    import sys
    import pandas as pd
    from tasks.core.files import write_parquet
    from tasks.core.store import ArtifactRef, Store

    store = Store(sys.argv[1])
    refs = {}
    for name in %r:
        path = store.path_for("d", "ingest", name, "0123456789abcdef")
        rows = write_parquet(pd.DataFrame({"x": [1, 2, 3]}), path)
        refs[name] = ArtifactRef(name, str(path), "0123456789abcdef", rows)
    store.record("ingest", "0123456789abcdef", "d", refs, input_fps={}, params={}, rows_computed=3, seconds=0.1,
                 peak_rss_mb=1.0, run_id="r")
""" % (NAMES,))


def _record_in_child(root: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RECORD, str(root)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=120)


def test_a_kill_at_any_statement_of_a_record_leaves_it_whole_or_absent(tmp_path):
    trace = tmp_path / "writes.txt"
    assert _record_in_child(tmp_path / "traced", **{FAULT_TRACE: str(trace)}).returncode == 0
    writes = trace.read_text().splitlines()
    assert [w.split("\t")[1].split()[0] for w in writes][:len(NAMES) + 1] == ["DELETE"] + ["INSERT"] * len(NAMES)
    for point in range(1, len(writes) + 1):
        root = tmp_path / f"at-{point}"
        killed = _record_in_child(root, **{FAULT_KILL_AT_WRITE: str(point)})
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        store = Store(root)
        names = set(store.query("SELECT name FROM stages")["name"])
        committed = writes[point - 1].split("\t")[1].startswith("(committed")
        assert names == (set(NAMES) if committed else set()), (point, names)
        assert (store.lookup("ingest", "0123456789abcdef") is not None) == committed
        findings, _ = examine(root, repair=False)
        assert not [f for f in findings if f.damage], findings  # an absent record is no damage: its files orphans


def test_an_error_half_way_through_a_record_records_nothing(tmp_path, monkeypatch):
    import tasks.core.catalog as catalog

    store = Store(tmp_path)
    refs = {}
    for name in NAMES:
        path = store.path_for("d", "ingest", name, "0123456789abcdef")
        refs[name] = ArtifactRef(name, str(path), "0123456789abcdef", write_parquet(pytest.importorskip(
            "pandas").DataFrame({"x": [1]}), path))
    calls = {"n": 0}
    real = catalog.fault_point

    def failing(sql: str = "COMMIT") -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # the DELETE and one INSERT done
            raise OSError("the disk went away")
        real(sql)

    monkeypatch.setattr(catalog, "fault_point", failing)
    with pytest.raises(OSError):
        store.record("ingest", "0123456789abcdef", "d", refs, input_fps={}, params={}, rows_computed=1, seconds=0.1,
                     peak_rss_mb=1.0, run_id="r")
    monkeypatch.setattr(catalog, "fault_point", real)
    assert store.query("SELECT count(*) AS n FROM stages")["n"].item() == 0


def test_the_doctor_removes_stale_temp_files_and_leaves_fresh_ones(tmp_path, capsys):
    from flows.commands.doctor import doctor

    store = Store(tmp_path)
    with store.catalog():
        pass
    part_dir = tmp_path / "_rows" / "embed" / "abc"
    part_dir.mkdir(parents=True)
    stale_part = part_dir / f".part-{'a' * 32}.parquet.{'b' * 32}.tmp"
    stage_dir = tmp_path / "d" / "ingest"
    stage_dir.mkdir(parents=True)
    stale_output = stage_dir / f".documents-0123456789abcdef.parquet.{'c' * 32}.tmp"
    fresh = part_dir / f".part-{'d' * 32}.parquet.{'e' * 32}.tmp"
    for path in (stale_part, stale_output, fresh):
        path.write_bytes(b"half a write")
    old = time.time() - STALE_TEMP_S - 60
    for path in (stale_part, stale_output):
        os.utime(path, (old, old))
    assert doctor(tmp_path, repair=False) == 0
    assert all(p.exists() for p in (stale_part, stale_output, fresh))
    assert doctor(tmp_path, repair=True) == 0
    out = capsys.readouterr().out
    assert not stale_part.exists() and not stale_output.exists() and fresh.exists()
    assert out.count("removed") == 2 and "being written now" in out, out
