"""A method's index phase as every command runs it, and its plan: the stage DAG without Prefect.

:func:`build_index` is the index phase of ``dagrag index``, ``evaluate`` and ``benchmark`` (Prefect tasks in their
flow run) and of opening a built index (``flows.serving.index.resolve``: every stage resolved from the catalog,
called directly); :func:`plan_run` is the same DAG planned (``dagrag plan``). Nothing here imports Prefect, so
opening an index for questions never pays for it.
"""
from __future__ import annotations

import contextlib
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.methods import METHODS
from flows.runtime.config import Config
from tasks.core.files import CATALOG
from tasks.data.ingest import dataset_label, ingest
from tasks.core.stage import RunContext
from tasks.core.store import ArtifactRef

if TYPE_CHECKING:
    from tasks.core.plan import Plan


def build_index(ctx: RunContext, conf: Config) -> tuple[dict[str, ArtifactRef], dict[str, ArtifactRef], float]:
    """Ingest + the method's index stages → (data refs, index refs, wall seconds of this phase)."""
    t0 = time.perf_counter()
    data = ingest(ctx, conf.dataset, conf.data_dir)
    index = METHODS[conf.method.name].index(ctx, data, conf)
    return data, index, time.perf_counter() - t0


def plan_run(conf: Config, command: str = "index") -> "Plan":
    """What ``command`` (``index``: the index phase every command runs; ``update``: the method's update DAG) would
    reuse and compute with ``conf``: the same flow code, its stages planned, none computed (:mod:`tasks.core.plan`).
    """
    from tasks.core.plan import Plan

    root = str(Path(conf.artifacts_dir).resolve())
    method = METHODS[conf.method.name]
    plan = Plan(root, dataset_label(conf.dataset), title=f"{command} of method={conf.method.name} on "
                f"{dataset_label(conf.dataset)} in {root}")
    dag = method.update if command == "update" and method.update is not None else method.index
    with contextlib.ExitStack() as stack:
        where = root
        if not (Path(root) / CATALOG).is_file():  # an update's search for stored versions would create one: such
            where = stack.enter_context(tempfile.TemporaryDirectory(prefix="dagrag-plan-"))  # stages read an empty one
        ctx = RunContext(where, plan.dataset, "plan", plan=plan)
        dag(ctx, ingest(ctx, conf.dataset, conf.data_dir), conf)
    return plan


def spacy_without_torch(ner: dict[str, Any]) -> bool:
    """Let spaCy load without torch (1.4 s) when the command's NER is a spaCy pipeline that needs none
    (:mod:`tasks.text.spacy_without_torch`); True if switched on."""
    from tasks.text.spacy_without_torch import pipeline_needs_torch, skip_torch_in_thinc

    if ner.get("backend") != "spacy" or pipeline_needs_torch(str(ner.get("model", ""))):
        return False
    return skip_torch_in_thinc()
