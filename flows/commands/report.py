"""``python -m flows.commands.report [report.runs=[ID,…] | report.sweep=ID] [report.name=NAME]``: the results report.

Reads only the DuckDB catalog (``metrics``, ``runs``, ``stage_events``, ``stages``, ``llm_ledger``), never a
run's output. Writes ``artifacts/reports/<name>/report.md`` with PNG figures beside it, and publishes the same
Markdown as a Prefect artifact. The last line printed is ``report: {json}``.

Selection: the given run ids; else a sweep's trials; else the latest ``evaluate`` run per method × dataset
(sweep trials excluded: they were tuned on the dev split). A sweep's table shows its best trial (highest
dev-split ``eval.objective``) scored on the **test** split only, so a sweep never reports a number it was
tuned on.
"""
from __future__ import annotations

import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import hydra
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.runtime.config import Config, load_config
from flows.runtime.observe import untagged_tasks
from tasks.core.files import CATALOG, write_bytes
from tasks.core.store import Store
from tasks.eval import report as rep

log = logging.getLogger("dagrag")

INDEX_EXCLUDED = ("evidence",)  # stages an evaluate run adds that are not part of building the index


def select_runs(store: Store, runs: tuple[str, ...], sweep: str | None) -> pd.DataFrame:
    """The ``evaluate`` metrics rows of the selection, metrics parsed."""
    base = ("SELECT run_id, method, dataset, metrics->>'experiment' AS experiment, created_at, metrics FROM metrics "
            "WHERE kind = 'evaluate'")
    if runs:
        frame = store.query(base + f" AND run_id IN ({', '.join('?' * len(runs))})", list(runs))
    elif sweep:
        frame = store.query(base + " AND metrics->>'sweep_id' = ?", [sweep])
    else:
        frame = store.query(base + " AND metrics->>'sweep_id' IS NULL")
        frame = frame.sort_values("created_at").groupby(["method", "dataset", "experiment"], sort=False,
                                                         dropna=False).tail(1)
    return frame.assign(metrics=frame["metrics"].map(json.loads)).reset_index(drop=True)


# a headline run is at the defaults: its command-line overrides name only these (compare's own, report's, hydra's)
HEADLINE_KEYS = ("dataset", "dataset.name", "experiment", "method", "artifacts_dir", "data_dir")
HEADLINE_PREFIXES = ("report.", "compare.", "hydra.")


def headline_runs(store: Store, datasets: tuple[str, ...]) -> pd.DataFrame:
    """The latest ``evaluate`` run at the defaults (overrides within :data:`HEADLINE_KEYS`) per method × dataset ×
    experiment, on ``datasets``: what ``dagrag compare`` and ``dagrag compare experiment=beyond_paper`` ran last."""
    frame = store.query("SELECT run_id, method, dataset, metrics->>'experiment' AS experiment, created_at, metrics "
                        "FROM metrics WHERE kind = 'evaluate' AND metrics->>'sweep_id' IS NULL")
    frame = frame[frame["dataset"].isin(datasets)]
    frame = frame.assign(metrics=frame["metrics"].map(json.loads))

    def at_defaults(metrics: dict) -> bool:
        keys = [o.lstrip("+~").split("=", 1)[0] for o in (metrics.get("overrides") or [])] \
            if isinstance(metrics.get("overrides"), list) else list(metrics.get("overrides") or {})
        return all(k in HEADLINE_KEYS or k.startswith(HEADLINE_PREFIXES) for k in keys)

    frame = frame[frame["metrics"].map(at_defaults)]
    frame = frame.sort_values("created_at").groupby(["method", "dataset", "experiment"], sort=False).tail(1)
    return frame.reset_index(drop=True)


def headline_rows(runs: pd.DataFrame) -> list[dict[str, Any]]:
    """The exported rows the headline table is rendered from: ids, commit, date and the table's metrics."""
    from tasks.eval.headline import ANSWER, RECALL

    out = []
    for _, r in runs.sort_values(["dataset", "experiment", "method"]).iterrows():
        row = {"run_id": r["run_id"], "method": r["method"], "dataset": r["dataset"], "experiment": r["experiment"],
               "git_sha": r.get("commit") or None, "created_at": str(r["created_at"])[:19]}
        row.update({k: float(r[k]) for k in RECALL})
        value = r.get(ANSWER)
        row[ANSWER] = None if value is None or pd.isna(value) else float(value)
        out.append(row)
    return out


def write_headline(rows: list[dict[str, Any]], conf: Config) -> list[str]:
    """``docs/results/headline.json`` and the table between the markers of README.md and docs/results.md."""
    from flows.methods import NAMES as METHOD_NAMES
    from tasks.eval.headline import headline_table, replace_between

    root = Path(conf.report.headline_root or next(p for p in Path(__file__).resolve().parents
                                                  if (p / "pyproject.toml").exists()))  # the checkout, wherever this module sits
    methods = [m for m in METHOD_NAMES if any(r["method"] == m for r in rows)]
    table = headline_table(rows, methods, list(conf.report.headline_datasets))
    export = {"command": "dagrag report report.headline=true", "datasets": list(conf.report.headline_datasets),
              "methods": methods, "rows": rows}
    written = []
    for rel in ("README.md", "docs/results.md"):
        path = root / rel
        path.write_text(replace_between(path.read_text(), table, str(path)))
        written.append(str(path))
    path = root / "docs" / "results" / "headline.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(export, indent=1) + "\n")
    return [*written, str(path)]


SETUP_GROUPS = ("method", "embedder", "ner", "kg")  # the config groups that decide what a query costs


def query_setups(store: Store, run_ids: list[str]) -> dict[str, str]:
    """Per run, its query-cost settings (the resolved ``SETUP_GROUPS`` of its manifest's config) as one string:
    a benchmark lends its ms/query only to evaluate runs with the same string."""
    if not run_ids:
        return {}
    found = store.query(f"SELECT run_id, manifest->>'config' AS config FROM runs "
                        f"WHERE run_id IN ({', '.join('?' * len(run_ids))})", run_ids)
    out = {}
    for run_id, config in zip(found["run_id"], found["config"]):
        config = json.loads(config) if isinstance(config, str) else {}
        out[run_id] = json.dumps({g: (config or {}).get(g) for g in SETUP_GROUPS}, sort_keys=True)
    return out


def run_facts(store: Store, run_ids: list[str]) -> pd.DataFrame:
    """Per run: commit, dataset identity (content hash, or the ingest fingerprint of a generated dataset),
    date, index build seconds and peak RSS (every index stage it used, at the cost it had when computed) and
    tokens."""
    if not run_ids:
        return pd.DataFrame(columns=["run_id", "commit", "dataset_hash", "date", "index_build_s", "index_peak_mb",
                                     "tokens"])
    marks = ", ".join("?" * len(run_ids))
    runs = store.query(f"SELECT run_id, manifest->>'git_sha' AS commit, manifest->>'dataset_content_hash' AS hash, "
                       f"started_at FROM runs WHERE run_id IN ({marks})", run_ids)
    ingest = store.query(f"SELECT run_id, any_value(fp) AS ingest_fp FROM stage_events WHERE stage = 'ingest' "
                         f"AND run_id IN ({marks}) GROUP BY run_id", run_ids)
    build = store.query(
        f"SELECT e.run_id, sum(s.seconds) AS index_build_s, max(s.peak) AS index_peak_mb FROM (SELECT DISTINCT "
        f"run_id, stage, fp FROM stage_events WHERE run_id IN ({marks}) AND stage NOT IN "
        f"({', '.join('?' * len(INDEX_EXCLUDED))})) e JOIN (SELECT stage, fp, max(seconds) AS seconds, "
        f"max(peak_rss_mb) AS peak FROM stages GROUP BY stage, fp) s USING (stage, fp) "
        f"GROUP BY e.run_id", run_ids + list(INDEX_EXCLUDED))
    tokens = store.query(f"SELECT run_id, sum(coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0)) AS tokens "
                         f"FROM llm_ledger WHERE run_id IN ({marks}) GROUP BY run_id", run_ids)
    out = runs.merge(ingest, on="run_id", how="left").merge(build, on="run_id", how="left")
    out = out.merge(tokens, on="run_id", how="left")
    out["dataset_hash"] = [h if h and h != "generated" else f"generated, ingest {fp}"
                           for h, fp in zip(out["hash"], out["ingest_fp"])]
    out["date"] = pd.to_datetime(out["started_at"]).dt.strftime("%Y-%m-%d")
    return out[["run_id", "commit", "dataset_hash", "date", "index_build_s", "index_peak_mb", "tokens"]]


def trial_parameters(overrides: pd.Series) -> pd.DataFrame:
    """A sweep's trials' overrides (``["method.alpha=0.7", …]``) → one column per config key, numbers as floats."""
    rows = [{k: v for k, v in (o.lstrip("+~").split("=", 1) for o in (ov or []) if "=" in o)
             if "." in k and not k.startswith("hydra.")}  # key=value of config keys, not group choices
            for ov in overrides]
    frame = pd.DataFrame(rows, index=overrides.index)
    for col in frame:
        num = pd.to_numeric(frame[col], errors="coerce")
        if num.notna().all():
            frame[col] = num
    return frame


def slug(name: str) -> str:
    """A name usable as a folder and a Prefect artifact key (lower-case letters, digits, dashes)."""
    return re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "report"


@flow(name="report")
@untagged_tasks
def report_flow(cfg: dict) -> dict[str, Any]:
    """Catalog → results table, accuracy–latency figure, sweep figure → report.md (+ a Prefect artifact)."""
    conf = load_config(cfg)
    params, store = conf.report, Store(conf.artifacts_dir)
    name = slug(params.name or params.sweep or ("runs" if params.runs else "latest"))
    out_dir = store.root / "reports" / name
    if (out_dir / "report.md").exists():
        log.info("replacing the report in %s (report.name=NAME writes one beside it)", out_dir)
    ks = list(conf.eval.ks)
    records = selected_runs(conf)
    runs = rep.flatten_metrics(records)
    facts = run_facts(store, runs["run_id"].tolist())
    runs = runs.merge(facts, on="run_id", how="left")
    bench = store.query("SELECT run_id, method, dataset, created_at, metrics FROM metrics WHERE kind = 'benchmark'")
    setups = query_setups(store, runs["run_id"].tolist() + bench["run_id"].tolist())
    runs["setup"] = runs["run_id"].map(setups)
    bench = bench.assign(metrics=bench["metrics"].map(json.loads), setup=bench["run_id"].map(setups))
    latency = rep.benchmark_latency(bench)
    pairs = set(zip(*(runs[c] for c in rep.LATENCY_KEY)))
    latency = latency[pd.Series([p in pairs for p in zip(*(latency[c] for c in rep.LATENCY_KEY))],
                                index=latency.index, dtype=bool)]

    md = [f"# dagrag report: {name}", ""]
    figures: list[str] = []
    shown = runs
    if params.sweep:
        md += sweep_section(runs, params.sweep, conf.eval.objective, params.metric, out_dir, store, figures)
        best = rep.best_trial(runs, conf.eval.objective)
        shown = runs[runs["run_id"] == best["run_id"]].copy()
        for col in [c for c in shown.columns if c.startswith("test/")]:  # the best trial, on the test split
            shown[col.split("/", 1)[1]] = shown[col]
    table = rep.results_table(shown, latency, ks)
    note = rep.caption(shown["commit"].fillna("").tolist(), shown["dataset_hash"].fillna("").tolist(),
                       shown["date"].fillna("").tolist())
    md += ["## Results" + (" (best trial, test split)" if params.sweep else ""), "",
           selection_line(params, len(runs)), "", rep.markdown_table(table), TABLE_NOTES, ""]
    points = accuracy_points(shown, latency, params.metric)
    if not points.empty:
        png = rep.accuracy_latency_figure(points, params.metric, note)
        write_bytes(png, out_dir / "accuracy_latency.png")
        figures.append("accuracy_latency.png")
        md += ["## Accuracy against latency", "", "![accuracy against latency](accuracy_latency.png)", "",
               f"*{params.metric} against ms per query, one point per method and batch size (benchmark runs; "
               f"an evaluate run's own batch where none). {note}*", ""]
    curves = answer_points(shown)
    if not curves.empty:
        write_bytes(rep.answer_context_figure(curves, note), out_dir / "answer_in_context.png")
        figures.append("answer_in_context.png")
        md += ["## Answer in context against tokens", "", "![answer in context](answer_in_context.png)", "",
               f"*answer_in_context@B against the mean tokens the reader's context held at each budget B, one line "
               f"per method (dashed: experiment=beyond_paper). {note}*", ""]
    from flows.commands.loadtest import report_section

    serving = report_section(store, out_dir)
    if serving:
        figures.append("serving_throughput.png")
    md += serving
    text = "\n".join(md)
    write_bytes(text.encode(), out_dir / "report.md")
    create_markdown_artifact(key=f"report-{name}", markdown=text, description=f"dagrag report {name}")
    result = {"report": str(out_dir / "report.md"), "figures": [str(out_dir / f) for f in figures],
              "runs": runs["run_id"].tolist(), "name": name}
    if params.headline:
        result["headline"] = write_headline(headline_rows(runs), conf)
    return result


TABLE_NOTES = (
    "\nrecall@k: gold passages in the top k. evidence_recall@k: gold supporting sentences among the top-k "
    "evidence units (ZoomRAG: ChunkZoom's chunks; others: sentences of the top-k passages ranked by "
    "query–sentence cosine). context_recall: gold passages whose text reaches the reader's context. "
    "answer_in_context@B: questions (yes/no left out; answer_in_context_n scored) with a gold answer, SQuAD-"
    "normalised, in the context the method hands its reader packed to B tokens. "
    "index_build_s: seconds each index stage took when it was computed, summed (also when this run found it "
    "cached). ms/q@b: mean ms per query at batch b (the latest benchmark run with the run's method, embedder, "
    "NER and KG settings; empty where none). peak_mem_mb: the larger of the "
    "index stages' peak RSS (each when it was computed, as for index_build_s) and the benchmark's. tokens: LLM "
    "prompt + completion tokens recorded for the run.")


def selection_line(params: Any, n: int) -> str:
    """How the runs were chosen, in words."""
    if params.runs:
        return f"Runs: {', '.join(params.runs)}."
    if params.sweep:
        return f"Sweep {params.sweep}: {n} trials."
    return "The latest evaluate run of each method on each dataset (sweep trials excluded)."


def answer_points(runs: pd.DataFrame) -> pd.DataFrame:
    """One point per run and budget: ``(dataset, method, experiment, budget, tokens, answer_in_context)``."""
    budgets = sorted(int(c.split("@")[1]) for c in runs.columns if c.startswith("answer_in_context@"))
    rows = [(r["dataset"], r["method"], r.get("experiment"), b, r.get(f"context_tokens@{b}"),
             r.get(f"answer_in_context@{b}")) for _, r in runs.iterrows() for b in budgets]
    frame = pd.DataFrame(rows, columns=["dataset", "method", "experiment", "budget", "tokens", "answer_in_context"])
    return frame.dropna(subset=["tokens", "answer_in_context"])


def accuracy_points(runs: pd.DataFrame, latency: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One point per method × dataset × batch size: the run's metric at the benchmark's ms/query
    (the evaluate run's own mean ms/query at its batch size where no benchmark exists)."""
    if metric not in runs:
        return pd.DataFrame()
    acc = runs[[*rep.LATENCY_KEY, metric, "query_ms_mean", "batch_size"]]
    pts = acc.drop(columns=["query_ms_mean", "batch_size"]).merge(latency, on=rep.LATENCY_KEY, how="inner")
    benched = set(zip(*(latency[c] for c in rep.LATENCY_KEY)))
    own = acc[pd.Series([p not in benched for p in zip(*(acc[c] for c in rep.LATENCY_KEY))], index=acc.index,
                        dtype=bool)]
    own = own.rename(columns={"query_ms_mean": "ms_per_query"})
    pts = pd.concat([pts, own], ignore_index=True)[["dataset", "method", "batch_size", "ms_per_query", metric]]
    return pts.dropna(subset=["ms_per_query", metric])


def sweep_section(runs: pd.DataFrame, sweep: str, objective: str, metric: str, out_dir: Path, store: Store,
                  figures: list[str]) -> list[str]:
    """The trials table (dev objective only), the best trial, and the sweep figure."""
    params = trial_parameters(runs["sweep_overrides"])
    trials = pd.concat([runs, params], axis=1)
    swept = rep.swept_parameters(trials, list(params.columns))
    best = rep.best_trial(trials, objective)
    dev_metric = f"dev/{objective}"
    rows = trials.sort_values("sweep_trial" if "sweep_trial" in trials else "created_at")
    table = rows[["sweep_trial", "method", "dataset", *swept, dev_metric]] if "sweep_trial" in rows else \
        rows[["method", "dataset", *swept, dev_metric]]
    lines = [f"## Sweep {sweep}", "",
             f"Objective: {objective} on the dev split (a seeded {best.get('dev_fraction', '')} share of the "
             "questions); the results table shows the best trial on the held-out test split.", "",
             f"Best trial: {best.get('sweep_trial', '')} ({', '.join(f'{p}={best[p]}' for p in swept)}), "
             f"dev {objective} {best[dev_metric]:.2f}, "
             f"test {objective} {best.get(f'test/{objective}', float('nan')):.2f}.",
             "", rep.markdown_table(table.reset_index(drop=True), digits=3), ""]
    if swept:
        note = rep.caption(trials["commit"].fillna("").tolist(), trials["dataset_hash"].fillna("").tolist(),
                           trials["date"].fillna("").tolist())
        png = rep.sweep_figure(trials, swept, dev_metric, note)
        write_bytes(png, out_dir / "sweep.png")
        figures.append("sweep.png")
        lines += ["![sweep](sweep.png)", "",
                  f"*dev-split {objective} against {', '.join(swept)} "
                  f"({'heatmap' if len(swept) == 2 else 'one line per value of another swept parameter'}). "
                  f"{note}*", ""]
    return lines


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point: ``report.*`` picks the runs, ``artifacts_dir`` the catalog."""
    from flows.runtime.api_server import ensure_api, flow_run_settings
    from flows.runtime.output import print_last_line

    from flows.runtime.exits import USER_ERRORS, fail_before_flow

    plain = OmegaConf.to_container(cfg, resolve=True)
    try:
        selected_runs(load_config(plain))
    except USER_ERRORS as err:  # before the flow: no server left running, nothing written
        fail_before_flow(err, cfg, plain.get("artifacts_dir"))
    ensure_api()
    with flow_run_settings():
        result = report_flow(plain)
    print_last_line("report", result)


def selected_runs(conf: Config) -> pd.DataFrame:
    """The evaluate runs ``report.*`` selects (:func:`select_runs`); a ``PreflightError`` where the catalog does
    not exist (read only where it exists, so a mistyped ``artifacts_dir`` creates nothing) or none match."""
    from flows.runtime.preflight import PreflightError

    catalog = Path(conf.artifacts_dir).resolve() / CATALOG
    if not catalog.exists():
        raise PreflightError(f"no catalog at {catalog}: artifacts_dir names no folder a dagrag command has run "
                             f"in (fix artifacts_dir, or run `dagrag evaluate` first)")
    params = conf.report
    if params.headline and not params.runs:
        records = headline_runs(Store(conf.artifacts_dir), params.headline_datasets)
    else:
        records = select_runs(Store(conf.artifacts_dir), params.runs, params.sweep)
    if records.empty:
        what = (f"report.runs={list(params.runs)}" if params.runs else f"report.sweep={params.sweep}"
                if params.sweep else "any evaluate run")
        raise PreflightError(f"no evaluate runs in {catalog} match {what}: `dagrag report` without report.runs "
                             f"and report.sweep shows the latest run of each method, and the catalog's runs "
                             f"table lists run ids")
    return records


if __name__ == "__main__":
    sys.exit(main())
