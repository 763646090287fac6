"""A small catalog written row by row through the Store: two methods on two datasets, a benchmark each,
and a sweep of six trials over two parameters, so that report and notebook tests run in seconds."""
from __future__ import annotations

from pathlib import Path

from tasks.core.files import write_bytes
from tasks.core.store import ArtifactRef, Store

DATASETS = {"hotpot-mini": "c0ffee0123456789", "wiki-mini": "decaf00123456789"}
METHODS = {"dense": 60.0, "zoomrag": 70.0}  # recall@5 on the first dataset; each dataset 5 points lower
SWEEP = "swp-test000001"
COMMIT = "abcdef1234567890abcdef1234567890abcdef12"


BUDGETS = (1000, 2000, 4000)


def _metrics(method: str, dataset: str, base: float, run_id: str) -> dict:
    shift = 5.0 * list(DATASETS).index(dataset)
    r5 = base - shift
    return {"method": method, "dataset": dataset, "n_questions": 20, "recall@2": r5 - 10, "recall@5": r5,
            "recall@10": r5 + 10, "evidence_recall@2": r5 - 30, "evidence_recall@5": r5 - 20,
            "evidence_recall@10": r5 - 15, "context_recall": r5 + 1, "index_seconds": 0.5, "query_ms_mean": 3.0,
            "batch_size": 256, "index_peak_rss_mb": 500.0, "run_id": run_id,
            "dev": {"n_questions": 10, "recall@5": r5 + 2}, "test": {"n_questions": 10, "recall@5": r5 - 2},
            "split": {"dev_fraction": 0.5, "seed": 0}, "experiment": "paper", "answer_in_context_n": 18,
            **{f"answer_in_context@{b}": r5 - 8 / (i + 1) for i, b in enumerate(BUDGETS)},
            **{f"context_tokens@{b}": 0.9 * b for b in BUDGETS}}


def _run(store: Store, run_id: str, dataset: str, command: str = "evaluate") -> None:
    store.record_run(run_id, command, {"git_sha": COMMIT, "dataset_content_hash": DATASETS[dataset],
                                       "config": {}})
    store.event(run_id, "ingest", "fp-ingest-" + dataset, dataset, "cached", rows=10, rows_computed=0,
                seconds=0.01, peak_rss_mb=300.0)
    store.event(run_id, "embed", "fp-embed-" + dataset, dataset, "cached", rows=10, rows_computed=0,
                seconds=0.01, peak_rss_mb=300.0)


def build_small_catalog(root: Path) -> Store:
    """Write the catalog under ``root`` (its ``catalog.duckdb``); returns the store."""
    store = Store(root)
    for dataset in DATASETS:  # the stages every run reuses: built once, 2.0 + 3.0 seconds
        for stage, seconds in [("ingest", 2.0), ("embed", 3.0)]:
            fp = f"fp-{stage}-{dataset}"
            ref = ArtifactRef(stage, str(root / dataset / f"{stage}.npy"), fp, 10)  # not Parquet: no view
            write_bytes(b"", Path(ref.path))  # a file to record (its size and hash)
            store.record(stage, fp, dataset, {stage: ref}, input_fps={}, params={}, rows_computed=10,
                         seconds=seconds, peak_rss_mb=400.0, run_id="builder")
    for method, base in METHODS.items():
        for dataset in DATASETS:
            old = f"old-{method}-{dataset}"  # an earlier run the report must not pick
            _run(store, old, dataset)
            store.record_metrics(old, "evaluate", method, dataset, _metrics(method, dataset, base - 40, old))
            run_id = f"run-{method}-{dataset}"
            _run(store, run_id, dataset)
            store.record_metrics(run_id, "evaluate", method, dataset, _metrics(method, dataset, base, run_id))
            bench = f"bench-{method}-{dataset}"
            _run(store, bench, dataset, "benchmark")
            rows = [{"batch_size": b, "ms_per_query_mean": ms, "peak_rss_mb": 900.0}
                    for b, ms in [(1, 20.0 if method == "zoomrag" else 8.0), (16, 4.0), (256, 1.5)]]
            store.record_metrics(bench, "benchmark", method, dataset, {"rows": rows})
    beyond = "run-zoomrag-beyond"  # the other experiment: a row of its own, the paper run kept beside it
    dataset = next(iter(DATASETS))
    _run(store, beyond, dataset)
    store.record_metrics(beyond, "evaluate", "zoomrag", dataset,
                         {**_metrics("zoomrag", dataset, METHODS["zoomrag"] + 30, beyond), "experiment": "beyond_paper"})
    for trial, (alpha, k) in enumerate([(0.6, 5), (0.6, 10), (0.7, 5), (0.7, 10), (0.8, 5), (0.8, 10)]):
        run_id = f"trial-{trial}"
        _run(store, run_id, "hotpot-mini")
        m = _metrics("zoomrag", "hotpot-mini", 50.0, run_id)
        m["dev"]["recall@5"] = 50.0 + 10 * alpha + k  # best: alpha 0.8, K 10 (trial 5)
        m["test"]["recall@5"] = 40.0 + trial
        m.update({"sweep_id": SWEEP, "sweep_trial": trial,
                  "sweep_overrides": [f"method.alpha={alpha}", f"method.top_k_docs={k}", "method=zoomrag"]})
        store.record_metrics(run_id, "evaluate", "zoomrag", "hotpot-mini", m)
    return store
