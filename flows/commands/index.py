"""``python -m flows.commands.index [overrides]``: build or update the chosen method's index, no evaluation.

On a grown or shrunk corpus this *is* the update path: per-document stages (chunk, NER, embed)
compute only new documents, global structures are rebuilt from the stored per-document tables.
The last line printed is ``index: {json}``.
"""
from __future__ import annotations

import sys
from typing import Any

import hydra
from omegaconf import DictConfig
from prefect import flow

from flows.runtime.config import load_config
from flows.runtime.observe import RUN_END_HOOKS, untagged_tasks
from flows.runtime.pipeline import build_index, dry_run_stop, run_command, start_run
from flows.runtime.tables import stage_counts, stage_split, stage_table
from tasks.llm.params import LLMDryRun


@flow(name="index", **RUN_END_HOOKS)
@untagged_tasks
def index_flow(cfg: dict) -> dict[str, Any]:
    """Ingest + the method's index stages."""
    conf = load_config(cfg)
    ctx, manifest = start_run(conf, "index")
    try:
        data, index, seconds = build_index(ctx, conf)
    except LLMDryRun as stop:
        return dry_run_stop(ctx, conf, stop)
    split = stage_split(ctx.store, ctx.run_id)
    print(stage_table(split), flush=True)
    summary = {"method": conf.method.name, "dataset": ctx.dataset, "n_documents": data["documents"].rows,
               "index_seconds": round(seconds, 3), **stage_counts(split),
               "artifacts": {k: v.path for k, v in index.items()}, "run_id": ctx.run_id}
    ctx.store.record_metrics(ctx.run_id, "index", conf.method.name, ctx.dataset, summary, manifest["overrides"])
    return summary


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point."""
    run_command(index_flow, cfg, "index")


if __name__ == "__main__":
    sys.exit(main())
