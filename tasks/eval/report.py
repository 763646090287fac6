"""The results report: catalog rows → the paper's table, its figures and their captions.

Pure functions over frames the report flow reads from the catalog (``flows/commands/report.py``): no catalog
access here, and each figure function writes one PNG with matplotlib (Agg backend) to the path it is given.
"""
from __future__ import annotations

import io
from typing import Any

import numpy as np
import pandas as pd

BATCHES = (1, 256)  # ms/query columns of the table, from the benchmark rows
PASSAGE_MEASURES = ("span_hit@", "span_in_context@", "doc_recall@", "result_chars@")


def flatten_metrics(records: pd.DataFrame) -> pd.DataFrame:
    """``metrics`` rows (run_id, method, dataset, created_at, metrics dict) → one column per scalar metric;
    the dev / test splits' scores become ``dev/<metric>`` and ``test/<metric>``."""
    rows = []
    for r in records.itertuples(index=False):
        m = dict(r.metrics)
        flat = {"run_id": r.run_id, "method": r.method, "dataset": r.dataset, "created_at": r.created_at}
        flat.update({k: v for k, v in m.items() if isinstance(v, (int, float, str, bool)) or v is None})
        flat["sweep_overrides"] = m.get("sweep_overrides") or []
        flat["dev_fraction"] = (m.get("split") or {}).get("dev_fraction")
        for split in ("dev", "test"):
            flat.update({f"{split}/{k}": v for k, v in (m.get(split) or {}).items()})
        rows.append(flat)
    return pd.DataFrame(rows)


# what a benchmark must share with an evaluate run to lend it its latency: the method, the dataset and the
# settings that decide a query's cost (``setup``: a string, equal for equal settings; flows.commands.report.query_setups)
LATENCY_KEY = ["method", "dataset", "setup"]


def benchmark_latency(bench: pd.DataFrame) -> pd.DataFrame:
    """Benchmark records (method, dataset, setup, created_at, metrics dict with ``rows``) → the
    latest per method × dataset × setup as long rows ``(method, dataset, setup, batch_size, ms_per_query,
    peak_rss_mb)``."""
    columns = [*LATENCY_KEY, "batch_size", "ms_per_query", "peak_rss_mb"]
    if bench.empty:
        return pd.DataFrame(columns=columns)
    latest = bench.sort_values("created_at").groupby(LATENCY_KEY, sort=False).tail(1)
    rows = [(r.method, r.dataset, r.setup, int(b["batch_size"]), float(b["ms_per_query_mean"]),
             float(b.get("peak_rss_mb", np.nan)))
            for r in latest.itertuples(index=False) for b in dict(r.metrics)["rows"]]
    return pd.DataFrame(rows, columns=columns)


def results_table(runs: pd.DataFrame, latency: pd.DataFrame, ks: list[int]) -> pd.DataFrame:
    """Every method on every dataset: recall@k, evidence recall, context recall, EM/F1 (where an LLM ran),
    index build seconds, ms/query at batch 1 and 256, peak memory and tokens. ``runs`` and ``latency`` both carry
    ``setup``: a run gets the latency of its own :data:`LATENCY_KEY`."""
    budgets = sorted(int(c.split("@")[1]) for c in runs.columns if str(c).startswith("answer_in_context@"))
    cols = ["dataset", "method", "experiment"] + [f"recall@{k}" for k in ks] + [f"evidence_recall@{k}" for k in ks]
    cols += ["context_recall"] + [f"answer_in_context@{b}" for b in budgets] + (
        ["answer_in_context_n"] if budgets else [])
    # long documents cut into passages (tasks.eval.spans), where a run has them: where the answer span lands,
    # which documents come back, what a result weighs
    cols += [c for c in runs.columns if str(c).startswith(PASSAGE_MEASURES) and runs[c].notna().any()]
    cols += ["em", "f1", "index_build_s"] + [f"ms/q@{b}" for b in BATCHES]
    cols += ["peak_mem_mb", "tokens", "run_id"]
    out = runs.copy()
    keys = list(zip(*(out[c] for c in LATENCY_KEY)))
    for b in BATCHES:
        at = latency[latency["batch_size"] == b].set_index(LATENCY_KEY)["ms_per_query"]
        out[f"ms/q@{b}"] = [at.get(key, np.nan) for key in keys]
    peak_q = latency.groupby(LATENCY_KEY)["peak_rss_mb"].max()
    # the index stages' peak, each when it was computed (flows.commands.report.run_facts)
    index_peak = out["index_peak_mb"] if "index_peak_mb" in out else pd.Series(np.nan, index=out.index)
    out["peak_mem_mb"] = [np.nanmax([p, peak_q.get(key, np.nan)]) if not (pd.isna(p) and key not in peak_q)
                          else np.nan for p, key in zip(index_peak, keys)]
    for c in cols:
        if c not in out:
            out[c] = np.nan
    return out[cols].sort_values(["dataset", "method", "experiment"]).reset_index(drop=True)


def markdown_table(frame: pd.DataFrame, digits: int = 1) -> str:
    """A GitHub Markdown table; numbers rounded, missing values as ``–``."""
    def cell(v: Any) -> str:
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return "–"
        if isinstance(v, (float, np.floating)):
            return f"{v:.{digits}f}"
        return str(v)

    head = "| " + " | ".join(frame.columns) + " |\n| " + " | ".join("---" for _ in frame.columns) + " |\n"
    return head + "".join("| " + " | ".join(cell(v) for v in row) + " |\n" for row in frame.itertuples(index=False))


def caption(commits: list[str], dataset_hashes: list[str], dates: list[str]) -> str:
    """A figure's caption line: the commit(s), dataset hash(es) and date(s) of the runs it shows."""
    def join(values: list[str]) -> str:
        return ", ".join(sorted(set(v for v in values if v))) or "unknown"

    return f"commit {join([c[:10] for c in commits])} · dataset {join(dataset_hashes)} · {join(dates)}"


def _save(fig: Any, note: str) -> bytes:
    """The figure as PNG bytes, with its caption printed under the axes."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.text(0.01, -0.02, note, fontsize=7, color="0.35", ha="left", va="top")  # below the axes' labels
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def answer_context_figure(points: pd.DataFrame, note: str) -> bytes:
    """answer_in_context@B against the mean context tokens at B, a line per method and experiment (dashed:
    beyond_paper), one panel per dataset. ``points``: ``(dataset, method, experiment, budget, tokens,
    answer_in_context)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted(points["dataset"].unique())
    fig, axes = plt.subplots(1, max(len(datasets), 1), figsize=(5.2 * max(len(datasets), 1), 4.2), squeeze=False)
    methods = sorted(points["method"].unique())
    colours = {m: plt.cm.tab10(i % 10) for i, m in enumerate(methods)}
    for ax, ds in zip(axes[0], datasets):
        sub = points[points["dataset"] == ds]
        for (m, exp), g in sub.groupby(["method", sub["experiment"].fillna("paper")]):
            g = g.sort_values("budget")
            label = m if exp == "paper" else f"{m} ({exp})"
            ax.plot(g["tokens"], g["answer_in_context"], "--" if exp == "beyond_paper" else "-", marker="o",
                    color=colours[m], label=label, markersize=4)
        ax.set_xlabel("mean tokens in the reader's context")
        ax.set_ylabel("answer in context (%)")
        ax.set_title(ds)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    return _save(fig, note)


def accuracy_latency_figure(points: pd.DataFrame, metric: str, note: str) -> bytes:
    """Accuracy against ms/query (log scale), one point per method and batch size, one panel per dataset
    (ZoomRAG's Figure 2). ``points``: ``(dataset, method, batch_size, ms_per_query, <metric>)``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    datasets = sorted(points["dataset"].unique())
    fig, axes = plt.subplots(1, max(len(datasets), 1), figsize=(5.2 * max(len(datasets), 1), 4.2), squeeze=False)
    methods = sorted(points["method"].unique())
    colours = {m: plt.cm.tab10(i % 10) for i, m in enumerate(methods)}
    markers = dict(zip(sorted(points["batch_size"].unique()), "os^Dv<>ph*"))
    for ax, ds in zip(axes[0], datasets):
        sub = points[points["dataset"] == ds]
        for m, g in sub.groupby("method"):
            g = g.sort_values("batch_size")
            ax.plot(g["ms_per_query"], g[metric], "-", color=colours[m], alpha=0.4)
            for x, y, b in zip(g["ms_per_query"], g[metric], g["batch_size"]):
                ax.scatter(x, y, color=colours[m], marker=markers[b], s=40)
            last = g.iloc[-1]
            ax.annotate(m, (last["ms_per_query"], last[metric]), fontsize=8, xytext=(4, 2), textcoords="offset points")
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("ms per query (log)")
        ax.set_ylabel(metric)
        ax.set_title(ds)
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], color="0.3", marker=mk, linestyle="", label=f"batch {b}") for b, mk in markers.items()]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="lower right")
    return _save(fig, note)


def swept_parameters(trials: pd.DataFrame, params: list[str]) -> list[str]:
    """The parameters that take more than one value across the trials."""
    return [p for p in params if p in trials and trials[p].astype(str).nunique() > 1]


def _levels(values: pd.Series, most: int = 5) -> pd.Series:
    """Values as plot levels: as they are when few, else binned into ``most`` quantile bins."""
    if values.nunique() <= most or not pd.api.types.is_numeric_dtype(values):
        return values
    return pd.qcut(values, most, duplicates="drop").map(lambda iv: round(float(iv.mid), 3))


def sweep_figure(trials: pd.DataFrame, swept: list[str], metric: str, note: str) -> bytes:
    """Recall against each swept parameter, one line per value of another swept parameter (mean over the
    rest); a heatmap when exactly two are swept."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if len(swept) == 2:
        a, b = swept
        grid = trials.assign(_a=_levels(trials[a]), _b=_levels(trials[b])).pivot_table(
            index="_b", columns="_a", values=metric, aggfunc="mean")
        fig, ax = plt.subplots(figsize=(5.5, 4.2))
        im = ax.imshow(grid.to_numpy(dtype=float), cmap="viridis", aspect="auto", origin="lower")
        ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns], rotation=45, fontsize=8)
        ax.set_yticks(range(grid.shape[0]), [str(i) for i in grid.index], fontsize=8)
        for (i, j), v in np.ndenumerate(grid.to_numpy(dtype=float)):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=7, color="w")
        ax.set_xlabel(a)
        ax.set_ylabel(b)
        fig.colorbar(im, ax=ax, label=metric)
        return _save(fig, note)
    fig, axes = plt.subplots(1, len(swept), figsize=(4.6 * len(swept), 3.8), squeeze=False)
    for ax, p in zip(axes[0], swept):
        other = next((o for o in swept if o != p), None)
        frame = trials.assign(_x=_levels(trials[p]))
        groups = frame.assign(_o=_levels(trials[other])).groupby("_o") if other else [(None, frame)]
        for value, g in groups:
            line = g.groupby("_x")[metric].mean().sort_index()
            ax.plot(line.index.astype(float) if pd.api.types.is_numeric_dtype(line.index) else line.index.astype(str),
                    line.to_numpy(), "o-", label=f"{other}={value}" if other else None)
        ax.set_xlabel(p)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if other:
            ax.legend(fontsize=7)
    return _save(fig, note)


def best_trial(trials: pd.DataFrame, objective: str) -> pd.Series:
    """The trial with the highest dev-split objective (ties: the earliest)."""
    return trials.sort_values([f"dev/{objective}", "created_at"], ascending=[False, True]).iloc[0]
