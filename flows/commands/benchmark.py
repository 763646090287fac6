"""``python -m flows.commands.benchmark [overrides]``: per-query latency and memory at several batch sizes.

For each ``benchmark.batch_sizes`` entry, ``benchmark.n_questions`` questions are answered in batches
of that size (after one warm-up batch); latency per query = batch wall time / batch size, split
into the parts the method reports (e.g. query NER, query encoding, DocZoom, ChunkZoom). Memory:
peak RSS of the process, and the peak of Python/numpy allocations during one batch (tracemalloc,
measured in a separate untimed pass). ``process_peak_rss_mb`` is the whole process's high-water mark:
loading the index included, which can exceed any batch's peak. The process's RSS also holds what any index
stage it computed left behind; ``stages_computed`` says how many it did (``flows.commands.scale`` builds first, in
another process, so that its benchmark computes none). Results go to the catalog; the last line printed is
``benchmark: {json}``.
"""
from __future__ import annotations

import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import pandas as pd
from omegaconf import DictConfig
from prefect import flow

from flows.runtime.config import Config, ConfigError, load_config
from flows.runtime.observe import RUN_END_HOOKS, untagged_tasks
from flows.runtime.pipeline import build_index, load_retriever, run_command, start_run
from flows.runtime.tables import format_table, stage_counts, stage_split
from tasks.data.ingest import parse_questions, read_json_list
from tasks.core.memory import PeakRSS
from tasks.core.store import Store


def benchmark_questions(conf: Config, questions: pd.DataFrame) -> list[str]:
    """The questions to time: the dataset's own, else those of ``benchmark.questions_from``."""
    texts = questions["question"].tolist()
    if not texts and conf.benchmark.questions_from:
        path = Path(conf.data_dir) / conf.benchmark.questions_from / "questions.json"
        texts = parse_questions(read_json_list(path), str(path))[0]["question"].tolist()
    if not texts:
        raise ConfigError("this dataset has no questions: set benchmark.questions_from=NAME "
                          "(a dataset under data_dir with questions.json), e.g. hotpotqa-100")
    reps = -(-conf.benchmark.n_questions // len(texts))
    return (texts * reps)[:conf.benchmark.n_questions]


def passes(n_texts: int, batch_size: int, repeat: int, min_batches: int) -> int:
    """How many passes over the questions time ``batch_size``: ``repeat``, or more until ``min_batches``
    batches are timed (one batch of 256 says nothing about a p95)."""
    per_pass = -(-n_texts // batch_size)
    return max(repeat, -(-min_batches // per_pass))


def time_batch_size(retriever: Any, texts: list[str], batch_size: int, k: int, repeat: int,
                    min_batches: int = 1) -> dict[str, Any]:
    """Latency distribution and part split at one batch size."""
    retriever.search(texts[:batch_size], k)  # warm-up
    per_query, parts, n_batches = [], {}, 0
    n_passes = passes(len(texts), batch_size, repeat, min_batches)
    with PeakRSS() as mem:
        for _ in range(n_passes):
            for s in range(0, len(texts), batch_size):
                batch = texts[s:s + batch_size]
                t0 = time.perf_counter()
                hits = retriever.search(batch, k)
                per_query += [(time.perf_counter() - t0) * 1000 / len(batch)] * len(batch)
                n_batches += 1
                for p, sec in hits.parts.items():
                    parts[p] = parts.get(p, 0.0) + sec * 1000
    n = len(per_query)
    v = np.asarray(per_query)
    row = {"batch_size": batch_size, "ms_per_query_mean": v.mean(), "ms_per_query_p50": np.percentile(v, 50),
           "ms_per_query_p95": np.percentile(v, 95), "ms_per_query_p99": np.percentile(v, 99),
           "batches": n_batches, "peak_rss_mb": mem.mb}
    row.update({f"{p}_ms": t / n for p, t in parts.items()})
    tracemalloc.start()
    retriever.search(texts[:batch_size], k)
    row["peak_alloc_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    if hasattr(retriever, "memory_probe"):  # method-specific memory split (e.g. ZoomRAG's walk vs M)
        row.update(retriever.memory_probe(texts[:batch_size]))
    return {k_: (round(float(v_), 3) if isinstance(v_, (float, np.floating)) else v_) for k_, v_ in row.items()}


@flow(name="benchmark", **RUN_END_HOOKS)
@untagged_tasks
def benchmark_flow(cfg: dict) -> dict[str, Any]:
    """Index (cached) then time retrieval at each batch size."""
    conf = load_config(cfg)
    ctx, manifest = start_run(conf, "benchmark")
    data, index, index_seconds = build_index(ctx, conf)
    texts = benchmark_questions(conf, Store.read(data["questions"]))
    retriever, _ = load_retriever(data, index, conf)
    rows = [time_batch_size(retriever, texts, bs, conf.method.top_k, conf.benchmark.repeat,
                            conf.benchmark.min_batches)
            for bs in conf.benchmark.batch_sizes]
    print(format_table(rows, list(rows[0].keys())), flush=True)
    result = {"method": conf.method.name, "dataset": ctx.dataset, "n_documents": data["documents"].rows,
              "n_questions": len(texts), "index_seconds": round(index_seconds, 3),
              "stages_computed": stage_counts(stage_split(ctx.store, ctx.run_id))["stages_computed"], "rows": rows,
              "process_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),  # KiB
              **getattr(retriever, "run_stats", dict)(), "run_id": ctx.run_id}
    ctx.store.record_metrics(ctx.run_id, "benchmark", conf.method.name, ctx.dataset, result, manifest["overrides"])
    return result


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    """Hydra entry point."""
    run_command(benchmark_flow, cfg, "benchmark")


if __name__ == "__main__":
    sys.exit(main())
