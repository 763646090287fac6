"""``python -m flows.commands.growth [growth.fraction=0.05] [growth.methods=[…]] [dataset=… data_dir=…] [overrides]``: what
an update costs against a full build, for every method: growth should cost what it adds.

1. The dataset's documents are split into a base corpus and a held-out ``growth.fraction`` of them (a seeded
   sample of the sorted document ids, so corpus order plays no part). Both corpora are written in HippoRAG
   format under ``<artifacts_dir>/growth/<name>/data/{base,full}/<label>/`` with the dataset's questions.
2. Every method in ``growth.methods`` indexes the base corpus (``dagrag index``, its own process) into a store of
   its own, ``<artifacts_dir>/growth/<name>/base/<method>``, so that its build pays every stage it uses (rows that
   another method embedded would otherwise come from the shared row cache for free). A later ``dagrag growth``
   with the same settings finds the base index stored and reuses it (the table then has no build wall time).
3. ``growth.repeats`` times per method: the base store is copied (:meth:`tasks.core.store.Store.copy_to`, hard
   links), ``dagrag update`` adds the held-out documents in its own process, and the copy is removed.

Each method's row, read back from the catalogs:

* build: the compute seconds of every stage the method's base index uses and the wall seconds of its command,
  both scaled linearly to the full corpus (the full build the update is compared with);
* update: the medians over the repeats of the command's wall seconds, of its computed stages' seconds, and of
  the rest (process start, imports, Prefect, writing the catalog), with the seconds and rows of each stage the
  median update computed (a per-row stage computes only the new rows; a global one all of its rows);
* the update as a share of the full build, in stage seconds and in wall seconds.

The table goes to ``<artifacts_dir>/reports/<name>/growth.md`` and each row to the catalog's ``metrics`` table
(kind ``growth``). A build or update that fails is a row saying so; the others go on. The last line printed is
``growth: {json}``.
"""
from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from flows.runtime.config import Config, ConfigError, GrowthParams
from flows.runtime.observe import ROW_STAGES
from flows.runtime.child_process import run_child
from flows.commands.scale import index_footprint
from tasks.data.ingest import dataset_label, load_dataset, question_records
from tasks.core.files import write_bytes
from tasks.core.store import Store


def passed_on(override: str) -> bool:
    """Whether a command-line override goes to every build and update (``method.*`` keys included: they must
    fit every method in ``growth.methods``), or is one growth sets itself (the corpus, the method, the store)."""
    key = override.split("=", 1)[0].lstrip("+~")
    return not (key.startswith(("growth.", "dataset")) or key in ("method", "data_dir", "artifacts_dir"))


def holdout_ids(doc_ids: list[str], fraction: float, seed: int) -> set[str]:
    """The documents held out of the base corpus: round(fraction · n) of them (at least one, never all), a seeded
    sample of the sorted ids, so the choice does not depend on the order the corpus lists them in."""
    ids = sorted(set(doc_ids))
    if len(ids) < 2:
        raise ValueError(f"growth needs a corpus of at least 2 documents, this one has {len(ids)}")
    n_out = min(max(int(round(fraction * len(ids))), 1), len(ids) - 1)
    picked = np.random.default_rng(seed).choice(len(ids), size=n_out, replace=False)
    return {ids[i] for i in picked}


def write_corpora(conf: Config, root: Path, params: GrowthParams) -> dict[str, Any]:
    """The base and full corpora of ``conf.dataset`` in HippoRAG format under ``root/data``; what was written."""
    docs, _, _, _ = load_dataset(conf.dataset, conf.data_dir)
    try:
        held = holdout_ids(docs["doc_id"].tolist(), params.fraction, params.seed)
    except ValueError as err:
        raise ConfigError(f"growth: {err}") from None
    label = dataset_label(conf.dataset)
    records = [{"title": t, "text": x} for t, x in zip(docs["title"].tolist(), docs["text"].tolist())]
    keep = ~docs["doc_id"].isin(held).to_numpy()
    questions = question_records(conf.dataset, conf.data_dir)
    for part, rows in (("base", [r for r, k in zip(records, keep) if k]), ("full", records)):
        for name, payload in (("corpus.json", rows), ("questions.json", questions)):
            write_bytes(json.dumps(payload, ensure_ascii=False).encode(), root / "data" / part / label / name)
    return {"label": label, "base_dir": str(root / "data" / "base"), "full_dir": str(root / "data" / "full"),
            "n_base": int(keep.sum()), "n_full": len(docs), "n_added": len(held)}


def child_argv(method: str, label: str, data_dir: str, artifacts_dir: str, overrides: list[str]) -> list[str]:
    """A build's or update's command line: the user's other overrides, then the corpus, method and store."""
    return [*overrides, f"method={method}", "dataset=hipporag", f"dataset.name={label}", f"data_dir={data_dir}",
            f"artifacts_dir={artifacts_dir}"]


def computed_stages(store: Store, run_id: str) -> pd.DataFrame:
    """``stage, seconds, rows_computed, rows`` of every stage one run computed (not the cached ones)."""
    ev = store.events(run_id)
    return ev.loc[ev["status"] == "computed", ["stage", "seconds", "rows_computed", "rows"]].reset_index(drop=True)


def measure_update(base: Store, copy_dir: Path, argv: list[str], timeout_s: int) -> dict[str, Any]:
    """One update on a fresh copy of the base store: wall and stage seconds, the stages it computed."""
    shutil.rmtree(copy_dir, ignore_errors=True)  # a copy left by a killed earlier run
    copy = base.copy_to(copy_dir)
    try:
        t0 = time.perf_counter()
        payload, error = run_child("update", argv, timeout_s)
        wall = time.perf_counter() - t0
        if payload is None:
            return {"error": f"update {error}"}
        stages = computed_stages(copy, payload["run_id"])
        stage_s = float(stages["seconds"].sum())
        summaries = (payload.get("segments_resummarized"), payload.get("segments_total"))  # EraRAG, ArchRAG
        return {"wall_s": wall, "stage_s": stage_s, "fixed_s": wall - stage_s, "stages": stages.to_dict("records"),
                "summaries": None if None in summaries else summaries,
                "split": update_split(wall, payload, stages)}
    finally:
        shutil.rmtree(copy_dir, ignore_errors=True)


def update_split(wall_s: float, payload: dict[str, Any], stages: pd.DataFrame) -> dict[str, float]:
    """Where one update's wall seconds went: the child's start-up (process start to its flow's
    body: interpreter, imports, config, Prefect's flow run), model loading (``timed`` steps that load or export
    a model, inside some stage's seconds: the encoder from its model cache; spaCy's load stays in the NER
    stage), the per-row stages (chunk, NER, embeddings: the new rows) and the whole-corpus ones (graphs,
    hierarchies, indexes) less that loading, the flow's other work (negative where stages ran side by side)
    and what came after the flow (its hooks, the last line, the exit, and this process's spawn and wait)."""
    loading = sum(s for what, s in (payload.get("timed") or {}).items() if what.startswith(("loading", "exporting")))
    per_row = float(stages.loc[stages["stage"].isin(ROW_STAGES), "seconds"].sum())
    whole = float(stages["seconds"].sum()) - per_row
    if per_row >= loading:  # the encoder is loaded by the first stage that embeds: a per-row one where any ran
        per_row -= loading
    else:
        whole -= loading
    flow_s, startup_s = float(payload.get("flow_s", 0.0)), float(payload.get("startup_s", 0.0))
    return {"startup_s": startup_s, "model_loading_s": loading, "per_row_s": per_row, "whole_corpus_s": whole,
            "flow_other_s": flow_s - float(stages["seconds"].sum()), "after_flow_s": wall_s - startup_s - flow_s}


def stage_note(stages: list[dict[str, Any]], min_seconds: float = 0.1,
               summaries: tuple[int, int] | None = None) -> str:
    """``embed 8.7 s (306/6119), …``: the stages an update computed, slowest first, with the rows they computed
    of their output's rows; those under ``min_seconds`` are only counted. ``summaries``: (made anew, in all) of
    a method that summarises (EraRAG's segments, ArchRAG's communities), said first."""
    parts = sorted(stages, key=lambda s: -s["seconds"])
    shown = [f"{s['stage']} {s['seconds']:.1f} s ({s['rows_computed']}/{s['rows']})" for s in parts
             if s["seconds"] >= min_seconds]
    rest = len(parts) - len(shown)
    head = [f"{summaries[0]} of {summaries[1]} summaries made anew"] if summaries else []
    return "; ".join(head + [", ".join(shown + ([f"{rest} more under {min_seconds} s"] if rest else []))])


def growth_row(method: str, corpora: dict[str, Any], build_s: float, build_wall: float | None,
               updates: list[dict[str, Any]]) -> dict[str, Any]:
    """One method's row: the build (stage and wall seconds, scaled to the full corpus), the median update and
    their ratios; ``build_wall`` is None when the base index was found stored (no ratio in wall time then)."""
    scale = corpora["n_full"] / corpora["n_base"]
    full_build = build_s * scale
    full_wall = None if build_wall is None else build_wall * scale
    ok = [u for u in updates if "error" not in u]
    row: dict[str, Any] = {"method": method, "n_base": corpora["n_base"], "n_added": corpora["n_added"],
                           "build_stage_s": round(build_s, 2), "build_wall_s": _round(build_wall),
                           "full_build_stage_s": round(full_build, 2), "full_build_wall_s": _round(full_wall)}
    if not ok:
        return {**row, "error": updates[-1]["error"] if updates else "no update ran"}
    median = {k: statistics.median(u[k] for u in ok) for k in ("wall_s", "stage_s", "fixed_s")}
    typical = min(ok, key=lambda u: abs(u["stage_s"] - median["stage_s"]))
    row.update({"update_wall_s": round(median["wall_s"], 2), "update_stage_s": round(median["stage_s"], 2),
                "update_fixed_s": round(median["fixed_s"], 2),
                "pct_of_build_stages": round(100 * median["stage_s"] / full_build, 1) if full_build else None,
                "pct_of_build_wall": None if full_wall is None else round(100 * median["wall_s"] / full_wall, 1),
                "update_stages": stage_note(typical["stages"], summaries=typical.get("summaries")),
                "update_split": {k: round(statistics.median(u["split"][k] for u in ok), 2) for k in SPLIT},
                "runs_stage_s": [round(u["stage_s"], 2) for u in ok],
                "runs_wall_s": [round(u["wall_s"], 2) for u in ok],
                "failed_runs": len(updates) - len(ok)})
    return row


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _num(value: Any) -> str:
    """A table cell: one decimal, or – where there is no number (a build found stored has no wall time)."""
    return "–" if value is None else f"{value:.1f}"


# update_split's parts, in the order of a command's life, with their column heads
SPLIT = {"startup_s": "start-up", "model_loading_s": "model loading", "per_row_s": "per-row stages",
         "whole_corpus_s": "whole-corpus stages", "flow_other_s": "rest of the flow", "after_flow_s": "after the flow"}


def split_markdown(rows: list[dict[str, Any]]) -> str:
    """Where each method's updates spent their wall seconds (medians of each part over the repeats, so they need
    not add up to the median wall time), one line per method that updated."""
    head = ["method", *(f"{h} s" for h in SPLIT.values()), "update wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("update_split"):
            cells = [_num(r["update_split"][k]) for k in SPLIT] + [_num(r["update_wall_s"])]
            lines.append("| " + " | ".join([r["method"], *cells]) + " |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict[str, Any]]) -> str:
    """The growth table as Markdown, one line per method."""
    head = ["method", "build stages / wall s", "full build stages / wall s (est.)", "update stages / wall s",
            "update fixed s", "% of build, stages / wall", "what the update computed"]
    pairs = [("build_stage_s", "build_wall_s"), ("full_build_stage_s", "full_build_wall_s"),
             ("update_stage_s", "update_wall_s"), ("update_fixed_s", None),
             ("pct_of_build_stages", "pct_of_build_wall")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("error"):
            lines.append(f"| {r['method']} | {r['error']} |" + " |" * (len(head) - 2))
            continue
        cells = [" / ".join(_num(r.get(c)) for c in pair if c) for pair in pairs]
        lines.append("| " + " | ".join([r["method"], *cells, r["update_stages"]]) + " |")
    return "\n".join(lines) + "\n"


def tables(rows: list[dict[str, Any]]) -> str:
    """growth.md: the table of builds and updates, then where the updates' wall seconds went."""
    return (markdown(rows) + "\nWhere each update's wall seconds went (medians over the repeats; model loading is "
            "inside the stage seconds and is taken out of them here; a negative rest of the flow means stages ran "
            "side by side):\n\n" + split_markdown(rows))


def growth_root(conf: Config) -> Path:
    """``<artifacts_dir>/growth/<name>``: the corpora, the base indexes and the update copies."""
    return Path(conf.artifacts_dir).resolve() / "growth" / conf.growth.name


def growth(conf: Config, overrides: list[str], corpora: dict[str, Any]) -> dict[str, Any]:
    """Build every method's base index and time its updates; the table written and recorded."""
    params, root = conf.growth, growth_root(conf)
    print(json.dumps({"growth_corpora": corpora}), flush=True)
    main = Store(conf.artifacts_dir)
    table_path = main.root / "reports" / params.name / "growth.md"
    rows: list[dict[str, Any]] = []
    for method in params.methods:
        t0 = time.perf_counter()
        base = Store(root / "base" / method)  # a store of its own: the build pays every stage it uses
        built, error = run_child("index", child_argv(method, corpora["label"], corpora["base_dir"],
                                                     str(base.root), overrides), params.timeout_s)
        build_wall = time.perf_counter() - t0
        if built is None:
            row = {"method": method, "error": f"build {error}"}
        else:
            build_s = index_footprint(base, built["run_id"])["index_seconds"]
            if built.get("stages_computed") == 0:  # the base index was already stored: no wall time of a build
                build_wall = None
            argv = child_argv(method, corpora["label"], corpora["full_dir"], str(root / "update"), overrides)
            updates = [measure_update(base, root / "update", argv, params.timeout_s) for _ in range(params.repeats)]
            row = growth_row(method, corpora, build_s, build_wall, updates)
            main.record_metrics(built["run_id"], "growth", method, corpora["label"],
                                {**row, "fraction": params.fraction, "seed": params.seed},
                                {"growth.fraction": str(params.fraction), "growth.seed": str(params.seed)})
        row["wall_seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps({"growth_row": row}), flush=True)
        rows.append(row)
        write_bytes(tables(rows).encode(), table_path)  # after each row: a long run shows what it has
    print(tables(rows), flush=True)
    return {"table": str(table_path), "corpora": corpora, "rows": rows}


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: check the config and every method's config, then build and update."""
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import ConfigCompositionException

    from flows.runtime.api_server import ensure_api, stop_api
    from flows.runtime.config import load_config
    from flows.runtime.output import print_last_line
    from flows.runtime.exits import USER_ERRORS, fail, verbose
    from flows.runtime.preflight import preflight

    plain = OmegaConf.to_container(cfg, resolve=True)
    task_overrides = list(HydraConfig.get().overrides.task)
    overrides = [o for o in task_overrides if passed_on(o)]
    try:
        conf = load_config(plain)
        for method in conf.growth.methods:  # every method's config is checked before the first build
            try:
                cell = compose("config", overrides=[o for o in task_overrides if o.split("=", 1)[0] != "method"]
                               + [f"method={method}"])
            except ConfigCompositionException as err:  # a method.* override this method does not have
                raise ConfigError(f"growth.methods: method={method} does not take these overrides: "
                                  f"{str(err).splitlines()[0]}") from None
            preflight(load_config(OmegaConf.to_container(cell, resolve=True)), "index")
        corpora = write_corpora(conf, growth_root(conf), conf.growth)
    except USER_ERRORS as err:
        stop_api()  # launched early by `dagrag growth`, unused
        fail(err, verbose(cfg))
    ensure_api()  # one Prefect server for every build and update: each child inherits its PREFECT_API_URL
    print_last_line("growth", growth(conf, overrides, corpora))


if __name__ == "__main__":
    sys.exit(main())
