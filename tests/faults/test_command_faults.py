"""What a user sees: the real ``dagrag`` command (``python -m flows.cli``) in a subprocess, on damaged stores, a bad
disk, hostile corpora and SIGTERM. Each ends with exit status 0 and the clean metrics, or with one ``error:`` (or
``interrupted:``) line that names the problem and the fix, and no traceback."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults.conftest import SMALL, flip, quarantined, recall, stage_file, truncate

REPO = Path(__file__).resolve().parents[2]


def env() -> dict[str, str]:
    """The test session's Prefect server for the child (it starts none of its own)."""
    from prefect.settings import PREFECT_API_URL

    return {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}


def dagrag(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=timeout)


def one_line(proc: subprocess.CompletedProcess, prefix: str = "error: ") -> str:
    """The single line of stderr that starts with ``prefix`` (progress bars aside); no traceback anywhere."""
    lines = [ln for ln in proc.stderr.replace("\r", "\n").splitlines() if ln.startswith(prefix)]
    assert len(lines) == 1 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    return lines[0]


def metrics(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1].split(": ", 1)[1])


def test_damage_at_rest_through_the_command(tmp_path):
    """Flipped bytes in a stage output: exit 2 and one line naming the file and the fix; the same command then
    gives the clean metrics. Half a catalog: one line naming `dagrag doctor doctor.repair=true`, which rebuilds
    it (exit 0); the doctor then finds the store healthy."""
    artifacts = tmp_path / "artifacts"
    run = ("evaluate", "method=bm25", *SMALL, f"artifacts_dir={artifacts}")
    clean = metrics(dagrag(*run))
    target = stage_file(artifacts, "ingest", "documents")
    flip(target)
    stopped = dagrag(*run)
    assert stopped.returncode == 2
    line = one_line(stopped)
    assert str(target) in line and "run the same command again" in line
    assert recall(metrics(dagrag(*run))) == recall(clean)

    truncate(artifacts / "catalog.duckdb")
    stopped = dagrag(*run)
    assert stopped.returncode == 2 and "doctor.repair=true" in one_line(stopped)
    assert dagrag("doctor", f"artifacts_dir={artifacts}").returncode == 1
    repaired = dagrag("doctor", "doctor.repair=true", f"artifacts_dir={artifacts}")
    assert repaired.returncode == 0 and "rebuilt" in repaired.stdout, repaired.stdout + repaired.stderr
    assert "catalog.duckdb" in quarantined(artifacts)  # the metrics after a rebuild: test_store_faults
    healthy = dagrag("doctor", f"artifacts_dir={artifacts}")
    assert healthy.returncode == 0 and "healthy" in healthy.stdout


def test_an_artifacts_dir_that_is_a_file_is_one_line(tmp_path):
    blocker = tmp_path / "store"
    blocker.write_text("not a folder")
    out = dagrag("evaluate", "method=bm25", *SMALL, f"artifacts_dir={blocker / 'inner'}")
    assert out.returncode == 2
    line = one_line(out)
    assert f"{blocker} is a file" in line and "point artifacts_dir at a folder" in line


def test_invalid_utf8_is_one_line_naming_file_line_and_offset_and_writes_nothing(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    good = [json.dumps({"title": f"T{i}", "text": f"Passage {i} about Paris."}).encode() for i in range(5)]
    good[3] = good[3].replace(b"Paris", b"Par\xe9s")
    corpus.write_bytes(b"\n".join(good) + b"\n")
    offset = len(b"\n".join(good[:3])) + 1 + good[3].index(b"\xe9")
    out = dagrag("index", "method=bm25", "dataset=jsonl", f"dataset.path={corpus}", f"artifacts_dir={tmp_path / 'a'}")
    assert out.returncode == 2
    line = one_line(out)
    assert str(corpus) in line and "line 4, record 3" in line and f"byte offset {offset}" in line
    # nothing of the corpus is stored: only the read stage's whole row parts (its error rows among them, so a
    # re-run names the same record without reading it again), the catalog and the run's logs
    stored = [p for p in (tmp_path / "a").rglob("*.parquet") if "read" not in p.relative_to(tmp_path / "a").parts]
    assert stored == [] and not list((tmp_path / "a").rglob("*.tmp")), stored


def test_a_passage_over_max_text_chars_is_refused_naming_its_record(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"title": f"T{i}", "text": "word " * (10 if i != 2 else 400)})
                                for i in range(4)) + "\n")
    out = dagrag("index", "method=bm25", "dataset=jsonl", f"dataset.path={corpus}", "dataset.max_text_chars=1000",
                 f"artifacts_dir={tmp_path / 'a'}")
    assert out.returncode == 2
    line = one_line(out)
    assert "record 2" in line and "max_text_chars=1000" in line


def test_sigterm_ends_a_run_with_the_one_interrupted_line(tmp_path):
    """SIGTERM printed nothing; it now ends as Ctrl-C does (exit 130, one `interrupted:` line), the run recorded
    as crashed, and the same command goes on from the stored stages."""
    argv = [sys.executable, "-m", "flows.cli", "evaluate", "method=dense", "dataset.n_passages=3000",
            "dataset.n_questions=10", f"artifacts_dir={tmp_path / 'artifacts'}"]
    log_path = tmp_path / "out.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env(), stdout=log, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while "embed          computing" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert one_line(subprocess.CompletedProcess(argv, 130, "", stderr), "interrupted: ")
    from tasks.core.store import Store

    assert Store(tmp_path / "artifacts").query("SELECT status FROM runs")["status"].tolist() == ["crashed"]


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return done.returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB tmpfs (mounting needs root: skipped elsewhere)."""
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, "16m"):
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_then_space_freed(small_disk, tmp_path):
    """ENOSPC mid-run: one line naming the file and the fix, no partial file left or trusted; once space is freed
    the same command goes on and gives the clean metrics. A read-only disk is one line before the flow."""
    artifacts = small_disk / "artifacts"
    run = ("evaluate", "method=dense", *SMALL, f"artifacts_dir={artifacts}")
    clean = metrics(dagrag(*run))
    used = sum(p.stat().st_size for p in artifacts.rglob("*") if p.is_file())
    shutil.rmtree(artifacts)
    filler = small_disk / "filler"
    free = shutil.disk_usage(small_disk).free
    with open(filler, "wb") as fh:  # leave about a third of what the run writes
        fh.write(b"\0" * (free - used // 3))
    full = dagrag(*run)
    assert full.returncode == 2
    line = one_line(full)
    assert "no space left" in line and str(artifacts) in line and "run the same command again" in line
    assert not list(artifacts.rglob("*.tmp"))
    filler.unlink()
    assert recall(metrics(dagrag(*run))) == recall(clean)
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    out = dagrag(*run)
    assert out.returncode == 2 and "read-only file system" in one_line(out)


def test_a_mistyped_top_level_key_is_named_with_its_nearest_match(tmp_path):
    """Hydra advised `+artifact_dir=…`, which then failed with another message; both spellings now get one."""
    for key in ("artifact_dir", "+artifact_dir"):
        out = dagrag("evaluate", "method=bm25", f"{key}={tmp_path}")
        assert out.returncode == 2 and "did you mean 'artifacts_dir'?" in one_line(out)
    assert not any(tmp_path.iterdir())
