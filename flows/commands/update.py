"""``python -m flows.commands.update [overrides]``: bring a method's index up to date with the current corpus.

Same overrides as ``flows.commands.index``. For ``method=erarag`` the hierarchy is updated from the latest
stored one of this dataset and config (EraRAG Alg. 3): new chunks are embedded (row-incremental
stage), hashed with the stored hyperplanes, and only segments whose membership changed are
re-summarised, with their ancestors; removed documents drop their leaves the same way. By default
(``method.update_segmenting=local``) the stored segments are kept and the result is stored with its base's
fingerprint among its inputs; ``rebuild`` cuts every layer as a build does and stores a build-equal graph. For
``method=serag`` the graph grows from the latest stored one (only rows involving new chunks are
computed; stored under its own fingerprint, which records the base) and the encoding tree is rebuilt,
its seconds reported. For ``method=archrag`` the index DAG runs as is (chunk, NER / extraction and embedding
stages are row-incremental, the communities are recomputed) and the summary says how many community summaries
were made anew: an unchanged community's summary comes from the content-addressed cache. Every other method runs exactly the ``flows.commands.index`` code path (its
per-document stages are row-incremental already). The last line printed is ``update: {json}``; the summary, with the per-layer table, is
recorded in the catalog's ``metrics`` table (kind ``update``).
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import hydra
import pandas as pd
from omegaconf import DictConfig
from prefect import flow

from flows.runtime.config import load_config
from flows.methods import METHODS
from flows.runtime.observe import RUN_END_HOOKS, untagged_tasks
from flows.runtime.pipeline import dry_run_stop, report_skipped, run_command, start_run
from flows.runtime.tables import format_table, stage_counts, stage_split, stage_table
from tasks.data.ingest import ingest
from tasks.core.progress import process_seconds, timed_seconds, timed_since
from tasks.core.store import ArtifactRef, Store
from tasks.llm.params import LLMDryRun

def update_dag(name: str) -> tuple[Callable, Callable | None]:
    """The method's update DAG (its own, else its index DAG) and the summary of what it did (None: none)."""
    method = METHODS[name]
    return method.update or method.index, method.update_summary


def document_diff(store: Store, dataset: str, method: str, documents: ArtifactRef, run_id: str) -> dict[str, int]:
    """Documents added / removed against the corpus this method's index last had on this dataset (none: all
    added).

    That corpus is the ``documents`` table that the newest earlier run of ``method`` on ``dataset`` ingested,
    among the runs that ended ``completed`` (or that predate run statuses). Another method's run does not count:
    it may have ingested the grown corpus already, while this method's index is still the old one.
    """
    prev = store.query(
        "SELECT s.path FROM stage_events e JOIN runs r ON r.run_id = e.run_id "
        "JOIN stages s ON s.stage = 'ingest' AND s.name = 'documents' AND s.fp = e.fp "
        "WHERE e.stage = 'ingest' AND e.dataset = ? AND e.run_id <> ? "
        "AND r.manifest->'config'->'method'->>'name' = ? AND coalesce(r.status, 'completed') = 'completed' "
        "ORDER BY e.created_at DESC", [dataset, run_id, method])
    now = set(Store.read(documents, ["doc_id"])["doc_id"])
    for path in prev["path"]:
        try:
            before = set(Store.read(path, ["doc_id"])["doc_id"])
        except OSError:
            continue
        return {"added_docs": len(now - before), "removed_docs": len(before - now)}
    return {"added_docs": len(now), "removed_docs": 0}


@flow(name="update", **RUN_END_HOOKS)
@untagged_tasks
def update_flow(cfg: dict) -> dict[str, Any]:
    """Ingest + the method's update (or index) stages; a summary of what was recomputed, and where the command's
    time went before and in the flow (``startup_s``: process start to this flow's body; ``flow_s``; ``timed``:
    the named steps, such as loading the encoder, that the stages' seconds include)."""
    startup_s, timed_before, flow_t0 = process_seconds(), timed_seconds(), time.perf_counter()
    conf = load_config(cfg)
    ctx, manifest = start_run(conf, "update")
    name = conf.method.name
    t0 = time.perf_counter()
    data = ingest(ctx, conf.dataset, conf.data_dir)
    report_skipped(data)
    dag, summarise = update_dag(name)
    try:
        index = dag(ctx, data, conf)
    except LLMDryRun as stop:
        return dry_run_stop(ctx, conf, stop)
    seconds = time.perf_counter() - t0
    split = stage_split(ctx.store, ctx.run_id)
    print(stage_table(split), flush=True)
    summary: dict[str, Any] = {"method": name, "dataset": ctx.dataset, "n_documents": data["documents"].rows}
    if summarise is not None:
        summary.update(summarise(ctx.store, ctx.run_id, ctx.dataset, index))
        if "per_layer" in summary:
            per_layer = pd.DataFrame(summary["per_layer"])
            print("\nper layer (layer l: the segments of layer l-1)")
            print(format_table(per_layer.to_dict("records"), list(per_layer.columns)), flush=True)
    else:  # the same code path as flows.commands.index
        summary.update(document_diff(ctx.store, ctx.dataset, name, data["documents"], ctx.run_id), segments_total=None,
                       segments_resummarized=None, layers=None, full_build_seconds_estimate=None,
                       same_as="flows.commands.index")
    summary.update(seconds=round(seconds, 3), **stage_counts(split),
                   artifacts={k: v.path for k, v in index.items()}, run_id=ctx.run_id,
                   startup_s=round(startup_s, 3), flow_s=round(time.perf_counter() - flow_t0, 3),
                   timed=timed_since(timed_before))
    ctx.store.record_metrics(ctx.run_id, "update", name, ctx.dataset, summary, manifest["overrides"])
    return summary


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point."""
    run_command(update_flow, cfg, "update")


if __name__ == "__main__":
    sys.exit(main())
