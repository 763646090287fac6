"""Flow tests: one isolated Prefect server for the session, and config composition helpers."""
from __future__ import annotations

import copy
import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF = str(Path(__file__).resolve().parents[2] / "conf")


_HARNESS_UP = False  # whether a session fixture below has started the server (tests/faults asks for it too)


@pytest.fixture(scope="session", autouse=True)
def prefect_isolated():
    """Prefect's database, home and result storage all in a temp dir (nothing leaks between sessions).

    Started once per session: ``tests/faults`` uses this fixture too, and a second server started beside the
    first left the process's event worker sending to the first, so the second never saw those task runs."""
    global _HARNESS_UP
    if _HARNESS_UP:
        yield
        return
    _HARNESS_UP = True
    home = tempfile.mkdtemp(prefix="dagrag-prefect-")
    os.environ["PREFECT_HOME"] = home
    os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = os.path.join(home, "results")
    from prefect.settings import temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    try:
        # a temporary server, as a command's own: its flow runs send no heartbeats (flows.runtime.api_server.flow_run_settings)
        with prefect_test_harness(server_startup_timeout=120), \
                temporary_settings(updates={"flows.heartbeat_frequency": None}):
            yield
    finally:
        _HARNESS_UP = False
        shutil.rmtree(home, ignore_errors=True)  # its database and results: ~6 MB per session otherwise left in /tmp


def make_config(tmp_path: Path, *overrides: str) -> dict:
    """Compose ``conf/`` with overrides, artifacts under ``tmp_path``; returns the resolved dict (a fresh copy)."""
    if any(o.lstrip("+~").startswith("artifacts_dir") for o in overrides):
        return _compose((f"artifacts_dir={tmp_path / 'artifacts'}", *overrides))
    cfg = copy.deepcopy(_composed(overrides))  # nothing in conf/ outside hydra's own node interpolates it
    cfg["artifacts_dir"] = str(tmp_path / "artifacts")
    return cfg


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple[str, ...]) -> dict:
    """One composition per distinct overrides (0.2-0.3 s each; many tests compose the same ones several times)."""
    return _compose(("artifacts_dir=artifacts", *overrides))


def _compose(overrides: tuple[str, ...]) -> dict:
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture
def count_submissions(monkeypatch):
    """The labels of the partitions submitted to Dask in this test (``DaskPartitionRunner.submit_partition``)."""
    from flows.runtime.runners import DaskPartitionRunner

    calls = []
    real = DaskPartitionRunner.submit_partition

    def counted(self, *args):
        calls.append(args[-1])
        return real(self, *args)

    monkeypatch.setattr(DaskPartitionRunner, "submit_partition", counted)
    return calls


def evaluated_store(tmp_path_factory: pytest.TempPathFactory, *overrides: str) -> tuple[Path, dict]:
    """One ``evaluate`` run into a fresh store of its own, for a module's tests to share (through
    :func:`copy_store`): ``(root, metrics)``, the store at ``root / "artifacts"`` and the run's files (hits, trace,
    metrics) at ``root / "run"``."""
    from flows.commands.evaluate import evaluate_flow

    root = tmp_path_factory.mktemp("evaluated")
    return root, evaluate_flow(make_config(root, *overrides), str(root / "run"))


def copy_store(root: Path, tmp_path: Path) -> Path:
    """A copy of the store at ``root / "artifacts"`` at ``tmp_path / "artifacts"`` (where :func:`make_config`
    points; the catalog follows a copied store): a test works on its own copy, the shared one stays as built."""
    shutil.copytree(root / "artifacts", tmp_path / "artifacts", ignore=shutil.ignore_patterns("runs"))
    return tmp_path / "artifacts"
