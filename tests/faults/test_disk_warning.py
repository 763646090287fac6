"""Before a store outgrows its disk: the real command warns, from preflight's estimate of what the method writes for
the corpus, before it writes anything (a 4 MB tmpfs; mounting needs root, so it is skipped elsewhere)."""
from __future__ import annotations

import os
import subprocess

import pytest

from tests.faults.test_command_faults import _mount_tmpfs, dagrag


@pytest.fixture
def tiny_disk(tmp_path):
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, "4m"):
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_store_that_would_outgrow_its_disk_is_warned_of_first(tiny_disk):
    artifacts = tiny_disk / "artifacts"
    out = dagrag("index", "method=bm25", "dataset=sample", "dataset.n_passages=20000", f"artifacts_dir={artifacts}")
    printed = out.stdout + out.stderr  # the log goes where Hydra sends it
    warning = [ln for ln in printed.splitlines() if "may write up to" in ln]
    assert len(warning) == 1, printed[-3000:]
    assert str(artifacts) in warning[0] and "MB are free there" in warning[0]
    assert out.returncode in (0, 2)  # it fits, or stops with the one full-disk line
