"""The table a sweep (``dagrag evaluate -m …``) ends with: one row per job, with the overrides that differ
between its jobs, recall@k and query latency.

A Hydra callback (``hydra.callbacks.sweep_table`` in ``conf/config.yaml``): when the multirun ends, it reads
the ``metrics.json`` each ``evaluate`` job wrote into its folder under the sweep folder. Jobs without one (a
sweep of ``dagrag index``, an LLM dry run) are not listed.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from flows.runtime.tables import format_table

ANSWER_KEYS = ["em", "f1", "contain_acc", "accuracy", "recall", "llm_acc"]


class SweepTable(Callback):
    """Prints :func:`sweep_table` of the sweep's jobs after the last one."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        jobs = sweep_jobs(sweep_dir)
        if jobs:
            print(f"\nsweep: {len(jobs)} jobs in {sweep_dir}")
            print(sweep_table(jobs), flush=True)


def sweep_jobs(sweep_dir: Path) -> list[dict[str, Any]]:
    """The ``metrics.json`` of every job folder under ``sweep_dir``, in job order, each with its ``job`` folder."""
    def job_order(path: Path) -> tuple[int, str]:
        num = re.match(r"\d+", path.parent.name)  # the folder starts with the job number (hydra.sweep.subdir)
        return (int(num.group()) if num else -1, path.parent.name)

    return [{"job": p.parent.name, **json.loads(p.read_text())}
            for p in sorted(sweep_dir.glob("*/metrics.json"), key=job_order)]


def sweep_table(jobs: list[dict[str, Any]]) -> str:
    """One row per job: the overrides whose values differ between jobs (all of them when none do), recall@k,
    answer scores when there are any, and query latency (its p95 where a job timed enough batches to have one)."""
    overrides = [job.get("overrides", {}) for job in jobs]
    keys = list(dict.fromkeys(k for o in overrides for k in o))
    varying = [k for k in keys if len({o.get(k) for o in overrides}) > 1] or keys
    scores = list(dict.fromkeys(k for job in jobs for k in job if k.startswith("recall@")))
    scores += [k for k in ANSWER_KEYS if any(k in job for job in jobs)]
    rows = [{**job, **{k: o.get(k, "") for k in varying}} for job, o in zip(jobs, overrides)]
    spread = ["query_ms_p95"] if any(job.get("query_ms_p95") is not None for job in jobs) else []  # >= 5 batches
    return format_table(rows, ["job", *varying, *scores, "query_ms_mean", *spread])
