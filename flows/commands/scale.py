"""``python -m flows.commands.scale [scale.sizes=[…]] [scale.methods=[…]] [overrides]``: the scale table.

For every size in ``scale.sizes`` (passages of the generated sample, ``dataset=sample``) and every method in
``scale.methods``, one ``flows.commands.index`` process builds what the method's index still lacks, then one
``flows.commands.benchmark`` process, started fresh, loads the index and times the questions. All cells share one
``artifacts_dir``: a stage two methods share (passage embeddings, NER) is computed once. Each cell of the
table is then read back from the catalog:

* index seconds: the compute seconds of every stage the method's index uses, shared ones included (what a
  user building only this method pays), each taken from the run that computed it;
* index peak memory: the largest peak RSS of those stages, each taken from the run that computed it;
* query peak memory: the peak RSS of the benchmark process over its whole life, which computed no stage: what
  serving the index takes (loading it, the encoder, the timed batches), free of what an index build left;
* ms/query: the median per-query latency at each of ``scale.batch_sizes``;
* disk: the bytes of those stages' artifact files.

The table goes to ``<artifacts_dir>/reports/<scale.name>/scale.md`` and each cell to the catalog's ``metrics``
table (kind ``scale``). A cell whose process fails (out of memory, say) is a row saying so; the others go on.
The last line printed is ``scale: {json}``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from flows.runtime.config import ScaleParams
from flows.runtime.child_process import run_child
from tasks.core.store import Store


def cell_overrides(size: int, method: str, params: ScaleParams, overrides: list[str]) -> list[str]:
    """The ``flows.commands.benchmark`` command line of one cell: this command's overrides, the size and the method."""
    sizes = ",".join(str(b) for b in params.batch_sizes)
    return [*overrides, "dataset=sample", f"dataset.n_passages={size}", f"method={method}",
            f"benchmark.batch_sizes=[{sizes}]", f"benchmark.n_questions={params.n_questions}"]


def index_footprint(store: Store, run_id: str) -> dict[str, float]:
    """Compute seconds, peak RSS and bytes on disk of every stage one run used (cached ones included)."""
    used = store.output_rows(run_id)
    per_stage = used.drop_duplicates(["stage", "fp"])
    paths = {p for p in used["path"].dropna().tolist() if p}
    return {"index_seconds": float(per_stage["seconds"].fillna(0).sum()),
            "index_peak_rss_mb": float(per_stage["peak_rss_mb"].fillna(0).max()) if len(per_stage) else 0.0,
            "disk_mb": sum(_bytes(Path(p)) for p in paths) / 2**20}


def _bytes(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size if path.exists() else 0


def cell_row(size: int, method: str, bench: dict[str, Any], store: Store) -> dict[str, Any]:
    """One row of the table from a benchmark's last line and the catalog."""
    row: dict[str, Any] = {"passages": size, "method": method, **index_footprint(store, bench["run_id"])}
    for r in bench["rows"]:
        row[f"ms_per_query_b{r['batch_size']}"] = r["ms_per_query_p50"]
    row["query_peak_rss_mb"] = bench["process_peak_rss_mb"]
    return row


def run_cell(argv: list[str], timeout_s: int) -> tuple[dict[str, Any] | None, str]:
    """Build the cell's index in one process, then time it in a fresh one, both within ``timeout_s``; (the
    ``benchmark:`` payload, "") or (None, why it failed, and in which step)."""
    t0 = time.perf_counter()
    built, error = run_child("index", argv, timeout_s)
    if built is None:
        return None, f"index {error}"
    left = timeout_s - (time.perf_counter() - t0) if timeout_s else 0
    if timeout_s and left < 1:
        return None, f"index took all of the {timeout_s} s"
    bench, error = run_child("benchmark", argv, int(left))  # 0 when timeout_s is 0: no limit
    if bench is not None and bench.get("stages_computed"):  # a stage the index run left: its memory is in here
        return None, f"benchmark computed {bench['stages_computed']} stage(s) the index run had not"
    return bench, "" if bench is not None else f"benchmark {error}"


def markdown(rows: list[dict[str, Any]], batch_sizes: list[int]) -> str:
    """The scale table as Markdown, one line per (size, method)."""
    cols = ["passages", "method", "index_seconds", "index_peak_rss_mb", "query_peak_rss_mb",
            *[f"ms_per_query_b{b}" for b in batch_sizes], "disk_mb"]
    head = ["passages", "method", "index s", "index peak MB", "query peak MB",
            *[f"ms/query @{b}" for b in batch_sizes], "disk MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['passages']} | {r['method']} | {r['error']} |" + " |" * (len(head) - 3))
            continue
        cells = [f"{r[c]:.1f}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def scale(params: ScaleParams, overrides: list[str], artifacts_dir: str) -> dict[str, Any]:
    """Every (size, method) cell in turn, the table written and recorded; the summary returned."""
    store = Store(artifacts_dir)
    rows = []
    for size in params.sizes:
        for method in params.methods:
            t0 = time.perf_counter()
            bench, error = run_cell(cell_overrides(size, method, params, overrides), params.timeout_s)
            row = ({"passages": size, "method": method, "error": error} if bench is None
                   else cell_row(size, method, bench, store))
            row["wall_seconds"] = round(time.perf_counter() - t0, 1)
            print(json.dumps({"scale_cell": row}), flush=True)
            if bench is not None:
                store.record_metrics(bench["run_id"], "scale", method, f"sample-{size}", row,
                                     {"dataset.n_passages": str(size)})
            rows.append(row)
    out = Path(artifacts_dir) / "reports" / params.name
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(rows, params.batch_sizes)
    tmp = out / "scale.md.tmp"
    tmp.write_text(table)
    os.replace(tmp, out / "scale.md")
    print(table, flush=True)
    return {"table": str(out / "scale.md"), "cells": rows}


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: check the config and every cell's config, then run the cells."""
    from hydra.core.hydra_config import HydraConfig

    from flows.runtime.api_server import ensure_api, stop_api
    from flows.runtime.config import load_config
    from flows.runtime.output import print_last_line
    from flows.runtime.exits import USER_ERRORS, fail, verbose
    from flows.runtime.preflight import preflight

    plain = OmegaConf.to_container(cfg, resolve=True)
    overrides = [o for o in HydraConfig.get().overrides.task
                 if not o.split("=", 1)[0].lstrip("+~").startswith(("scale.", "dataset", "method", "benchmark."))]
    try:
        conf = load_config(plain)
        params = conf.scale
        from hydra import compose

        for size in params.sizes:  # every cell's config is checked before the first one runs
            for method in params.methods:
                cell = compose("config", overrides=cell_overrides(size, method, params, overrides))
                preflight(load_config(OmegaConf.to_container(cell, resolve=True)), "benchmark")
    except USER_ERRORS as err:
        stop_api()  # launched early by `dagrag scale`, unused
        fail(err, verbose(cfg))
    ensure_api()  # one Prefect server for every cell: each cell's process inherits its PREFECT_API_URL
    print_last_line("scale", scale(params, overrides, conf.artifacts_dir))


if __name__ == "__main__":
    sys.exit(main())
