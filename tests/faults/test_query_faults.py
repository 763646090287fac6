"""``dagrag query`` as a user meets it, in a subprocess: a damaged index is one line naming the file and the command
that rebuilds it; passages with control characters and huge titles print safely in the human format and exactly
in JSONL; a question with nothing to match says so."""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.faults.conftest import SMALL, truncate
from tests.faults.test_command_faults import dagrag, one_line


@pytest.fixture(scope="module")
def bm25_store(tmp_path_factory):
    artifacts = tmp_path_factory.mktemp("bm25") / "artifacts"
    built = dagrag("index", "method=bm25", *SMALL, f"artifacts_dir={artifacts}")
    assert built.returncode == 0, built.stderr[-3000:]
    return artifacts


def query(artifacts, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(dagrag_argv("query", "method=bm25", *SMALL, f"artifacts_dir={artifacts}", *args),
                          input=stdin, capture_output=True, text=True, timeout=300,
                          cwd=_repo(), env=_env())


def dagrag_argv(*args: str) -> list[str]:
    import sys

    return [sys.executable, "-m", "flows.cli", *args]


def _repo():
    from tests.faults.test_command_faults import REPO

    return REPO


def _env():
    from tests.faults.test_command_faults import env

    return env()


def test_a_damaged_index_is_one_line_naming_the_file_and_the_rebuild(bm25_store, tmp_path):
    import shutil

    artifacts = tmp_path / "artifacts"
    shutil.copytree(bm25_store, artifacts)
    (tar,) = artifacts.glob("*/bm25_index/bm25-*.tar")
    truncate(tar)
    out = query(artifacts, "--", "Who founded the city?")
    assert out.returncode == 2, out.stderr[-3000:]
    line = one_line(out)
    assert str(tar) in line and "damaged" in line and "dagrag index" in line, line
    assert "computed again" not in out.stderr and "not built" not in out.stderr, out.stderr
    rebuild = line.split("rebuild it with: ", 1)[1].split()
    assert rebuild[:2] == ["dagrag", "index"]
    assert dagrag(*rebuild[1:]).returncode == 0
    again = query(artifacts, "--", "Who founded the city?")
    assert again.returncode == 0 and "Q1" in again.stdout, again.stderr[-3000:]
