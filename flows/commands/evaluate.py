"""``python -m flows.commands.evaluate [overrides]``: index (cached), retrieve in batches, score, record.

The last line printed is ``metrics: {json}``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable

import hydra
import numpy as np
import pandas as pd
from omegaconf import DictConfig
from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.runtime.config import Config, load_config
from flows.methods import METHODS
from flows.runtime.observe import RUN_END_HOOKS, untagged_tasks
from flows.runtime.output import write_json
from flows.runtime.pipeline import build_index, dry_run_stop, load_retriever, run_command, start_run
from flows.runtime.tables import format_table, stage_counts, stage_split, stage_table
from tasks.data.ingest import gold_evidence
from tasks.core.stage import RunContext
from tasks.core.files import write_parquet
from tasks.core.store import ArtifactRef, Store
from tasks.eval.answer_context import answer_in_context
from tasks.eval.answer_metrics import score_predictions
from tasks.eval.evidence import score_evidence
from tasks.eval.metrics import (
    dev_split,
    document_hits,
    document_titles,
    latency_summary,
    recall_at_k,
    recall_by_title_mention,
    recall_by_type,
)
from tasks.eval.retrieve import retrieve_all
from tasks.eval.spans import (document_recall, gold_documents, passage_lineage, result_size, span_hit_at_k,
                              span_in_context, span_rows)
from tasks.llm.client import make_client
from tasks.llm.generate import build_reader_messages, contexts_for, generate
from tasks.llm.ner import QUERY_NER_STAGE
from tasks.llm.params import LLMDryRun
from tasks.text.embed import cached_encode, encode_queries

log = logging.getLogger("dagrag")
EVIDENCE_EMB = "evidence_sentence_emb"  # row cache of the passage rule's sentence embeddings, by content


@task(name="retrieve", cache_policy=NO_CACHE)
def retrieve(ctx: RunContext, conf: Config, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef],
             run_dir: str) -> dict[str, Any]:
    """Answer every question in batches; write hits, per-query latency and traces into the run folder."""
    questions = Store.read(data["questions"])
    if conf.eval.max_questions:
        questions = questions.head(conf.eval.max_questions)
    retriever, load_s = load_retriever(data, index, conf)
    ner_client = getattr(getattr(retriever, "recogniser", None), "client", None)
    try:
        hits, latency, traces = retrieve_all(retriever, questions, retrieval_depth(conf), conf.eval.batch_size)
    finally:  # ner=llm: the questions' entity calls (failed ones too), in the ledger like the corpus's
        if ner_client is not None:
            ctx.store.record_ledger(ctx.run_id, QUERY_NER_STAGE, ner_client.ledger_summary(QUERY_NER_STAGE))
    out = Path(run_dir)
    write_parquet(hits, out / "hits.parquet")
    write_parquet(latency, out / "latency.parquet")
    if traces:
        write_parquet(pd.DataFrame([{k: json.dumps(v, default=str) if isinstance(v, (list, dict)) else v
                                           for k, v in t.items()} for t in traces]), out / "trace.parquet")
    extra = getattr(retriever, "run_stats", dict)()
    return {"hits": str(out / "hits.parquet"), "latency": str(out / "latency.parquet"),
            "qids": questions["qid"].tolist(), "load_seconds": load_s, **extra}


def retrieval_depth(conf: Config) -> int:
    """Passages ranked per question: enough for recall@k, the method's own top_k and answer_in_context's depth."""
    return max(conf.eval.ks + (conf.method.top_k, conf.eval.answer_depth))


def answers_in_context(conf: Config, data: dict[str, ArtifactRef], hits: pd.DataFrame, run_dir: str,
                       qids: list[str]) -> dict[str, Any]:
    """``answer_in_context@B`` for each of ``eval.answer_budgets`` (:mod:`tasks.eval.answer_context`) on the
    context each method hands its reader (:func:`contexts_for`: its own items, else all its ranked passages)."""
    trace_path = Path(run_dir) / "trace.parquet"
    traces = Store.read(trace_path) if trace_path.exists() else None
    contexts = contexts_for(hits, Store.read(data["documents"]), traces, retrieval_depth(conf))
    questions = Store.read(data["questions"], ["qid", "answers"]).set_index("qid")["answers"]
    answers = {q: list(questions[q]) for q in qids}
    return answer_in_context(contexts, answers, list(conf.eval.answer_budgets))


def passage_measures(conf: Config, data: dict[str, ArtifactRef], hits: pd.DataFrame, gold: pd.DataFrame,
                     qids: list[str]) -> dict[str, Any]:
    """What a result is, on documents cut into passages (:mod:`tasks.eval.spans`): ``doc_recall@k`` and
    ``result_chars@n`` / ``result_tokens@n`` (n = ``eval.context_passages``) on every dataset; ``span_hit@k`` and
    ``span_in_context@B`` (the ``eval.answer_budgets``) where the questions hold answer spans (a long-document
    set: ``python -m tasks.data.longdocs``)."""
    docs = Store.read(data["documents"])
    lineage = passage_lineage(docs)
    gold_docs = gold_documents(gold, lineage)
    out: dict[str, Any] = {**document_recall(hits, lineage, gold_docs, list(conf.eval.ks), qids),
                           **result_size(hits, lineage, conf.eval.context_passages, qids)}
    spans = span_rows(Store.read(data["questions"]), gold_docs, qids)
    if len(spans):
        out["span_n"] = int(spans["qid"].nunique())
        out.update(span_hit_at_k(hits, lineage, spans, list(conf.eval.ks)))
        out.update(span_in_context(hits, lineage, spans, list(conf.eval.answer_budgets)))
    return out


@flow(name="evaluate", **RUN_END_HOOKS)
@untagged_tasks
def evaluate_flow(cfg: dict, run_dir: str) -> dict[str, Any]:
    """One evaluation run: ingest → method index → batched retrieval → recall@k and latency."""
    conf = load_config(cfg)
    ctx, manifest = start_run(conf, "evaluate")
    try:
        data, index, index_seconds = build_index(ctx, conf)
    except LLMDryRun as stop:  # an LLM index stage estimated its cost; retrieval needs the index
        return dry_run_stop(ctx, conf, stop)
    result = retrieve(ctx, conf, data, index, run_dir)
    hits, latency = Store.read(result["hits"]), Store.read(result["latency"])
    gold = Store.read(data["gold"])
    lineage = Store.read(data["documents"], ["doc_id", "title", "document"])
    doc_hits = document_hits(hits, lineage)  # gold names source documents: a hit on a piece counts for its own
    split = stage_split(ctx.store, ctx.run_id)
    lat = latency_summary(latency)
    metrics = {
        "method": conf.method.name, "dataset": ctx.dataset, "experiment": conf.eval.experiment,
        "overrides": manifest["overrides"],
        "n_documents": data["documents"].rows,
        "n_questions": len(result["qids"]), **recall_at_k(doc_hits, gold, list(conf.eval.ks), result["qids"]),
        "index_seconds": round(index_seconds, 3),
        "query_ms_mean": lat["mean"], "query_ms_p50": lat["p50"], "query_ms_p95": lat["p95"],
        "query_ms_p99": lat["p99"], "batch_size": conf.eval.batch_size,
        "retriever_load_seconds": round(result["load_seconds"], 3),
        "stages_computed": stage_counts(split)["stages_computed"],
        "index_stage_seconds": split.groupby("stage", sort=False)["seconds"].sum().round(3).to_dict(),
        # this run's index stages; none computed → null, not 0 (`dagrag report` takes each stage's computing run)
        "index_peak_rss_mb": round(float(split["peak_rss_mb"].max()), 1) if (split["status"] == "computed").any()
        else None,
        "recall_by_type": recall_by_type(doc_hits, gold, Store.read(data["questions"]), list(conf.eval.ks),
                                         result["qids"]),
        "recall_by_title_mention": recall_by_title_mention(doc_hits, gold, Store.read(data["questions"]),
                                                           document_titles(lineage), list(conf.eval.ks),
                                                           result["qids"]),
        "shuffle_seed": conf.dataset.shuffle_seed, "run_id": ctx.run_id,
        **{k: v for k, v in result.items() if k not in {"hits", "latency", "qids", "load_seconds"}},
    }
    sentences = Store.read(gold_evidence(ctx, conf.dataset, conf.data_dir)["gold_sentences"])
    score_evidence_of = evidence_scorer(ctx, conf, data, sentences, run_dir)
    metrics.update(score_evidence_of(hits))
    metrics.update(answers_in_context(conf, data, hits, run_dir, result["qids"]))
    metrics.update(passage_measures(conf, data, hits, gold, result["qids"]))
    metrics.update(split_metrics(conf, hits, gold, result["qids"], score_evidence_of, doc_hits))
    metrics.update(sweep_info())
    metrics.update(answer(ctx, conf, data, index, hits, run_dir))
    ctx.store.record_metrics(ctx.run_id, "evaluate", conf.method.name, ctx.dataset, metrics, manifest["overrides"])
    write_json(Path(run_dir) / "metrics.json", metrics)
    write_json(Path(run_dir) / "manifest.json", manifest)
    report(metrics, split)
    return metrics


def evidence_scorer(ctx: RunContext, conf: Config, data: dict[str, ArtifactRef], sentences: pd.DataFrame,
                    run_dir: str) -> Callable[[pd.DataFrame], dict[str, Any]]:
    """``hits → evidence_recall@k`` (gold supporting sentences in the top-k evidence units) and ``context_recall``
    (gold passages in the reader's context); the rules are in :mod:`tasks.eval.evidence`. The inputs are read
    once and each question is encoded once, however many subsets (all, dev, test) are scored."""
    trace_path = Path(run_dir) / "trace.parquet"
    method = METHODS[conf.method.name]
    docs, gold, questions = (Store.read(data[n]) for n in ("documents", "gold", "questions"))
    traces = Store.read(trace_path) if trace_path.exists() else None
    q_emb: dict[str, np.ndarray] = {}

    def encode_questions(texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in q_emb]
        if missing:
            q_emb.update(zip(missing, encode_queries(missing, conf.embedder)))
        return np.stack([q_emb[t] for t in texts]) if texts else np.zeros((0, 0), dtype=np.float32)

    # a method with its own generation has a passage context only where its trace names each item's passages
    passage_context = method.answer is None or (traces is not None and "context_docs" in traces.columns)

    def score(hits: pd.DataFrame) -> dict[str, Any]:
        return score_evidence(
            hits, docs, gold, sentences, questions, traces, list(conf.eval.ks), method.evidence_units,
            passage_context, conf.eval.context_passages, conf.eval.max_context_tokens,
            lambda texts: cached_encode(ctx.store, texts, conf.embedder, EVIDENCE_EMB), encode_questions)
    return score


def split_metrics(conf: Config, hits: pd.DataFrame, gold: pd.DataFrame, qids: list[str],
                  score_evidence_of: Callable[[pd.DataFrame], dict[str, Any]],
                  doc_hits: pd.DataFrame | None = None) -> dict[str, Any]:
    """Retrieval metrics on the seeded dev split and on the test split (``eval.dev_fraction``): a sweep
    maximises the dev score, and a report shows the best trial's test score. Recall counts ``doc_hits`` (hits
    on the documents gold names, :func:`tasks.eval.metrics.document_hits`; default ``hits``)."""
    doc_hits = hits if doc_hits is None else doc_hits
    if not conf.eval.dev_fraction:
        return {}
    out: dict[str, Any] = {"split": {"dev_fraction": conf.eval.dev_fraction, "seed": conf.eval.split_seed}}
    for name, part in zip(["dev", "test"], dev_split(qids, conf.eval.dev_fraction, conf.eval.split_seed)):
        sub = hits[hits["qid"].isin(set(part))]
        scores = {"n_questions": len(part),
                  **recall_at_k(doc_hits[doc_hits["qid"].isin(set(part))], gold, list(conf.eval.ks), part)}
        scores.update({k: v for k, v in score_evidence_of(sub).items()
                       if k.startswith("evidence_recall@") or k == "context_recall"})
        out[name] = scores
    return out


def sweep_info() -> dict[str, Any]:
    """``sweep_id`` (a hash of the sweep folder), trial number and overrides when run as a Hydra multirun job."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):  # not inside a Hydra job (a test calling the flow)
        return {}
    if hc.mode != RunMode.MULTIRUN:
        return {}
    sweep_dir = str(Path(hc.sweep.dir).resolve())
    return {"sweep_id": "swp-" + hashlib.sha1(sweep_dir.encode()).hexdigest()[:10], "sweep_dir": sweep_dir,
            "sweep_trial": int(hc.job.num), "sweep_overrides": list(hc.overrides.task),
            "sweeper": str(hc.sweeper.get("_target_", ""))}


def answer(ctx: RunContext, conf: Config, data: dict[str, ArtifactRef], index: dict[str, ArtifactRef],
           hits: pd.DataFrame, run_dir: str) -> dict[str, Any]:
    """Generation and answer metrics when an LLM is configured (``llm=none``: skipped, one log line).

    A method with its own generation (``Method.answer``: ArchRAG's adaptive filtering) answers from what it
    retrieved (its traces); every other method's top passages go to the shared reader. Either way the answers
    are scored here, the same way (``eval.llm_judge``: by the LLM judge too).
    """
    client = make_client(conf.llm, Path(ctx.artifacts_dir) / "llm_cache.duckdb") if conf.eval.generate else None
    if client is None:
        return {}
    questions = Store.read(data["questions"]).set_index("qid").loc[hits["qid"].unique()].reset_index()
    trace_path = Path(run_dir) / "trace.parquet"
    traces = Store.read(trace_path) if trace_path.exists() else None
    own = METHODS[conf.method.name].answer
    try:
        if own is not None:
            predictions, figures = own(client, data, index, conf, questions, traces, conf.eval.llm_dry_run)
            if predictions is None:
                log.info("llm dry run: generation would make %s", figures["llm_dry_run"])
                return figures
        else:
            contexts = contexts_for(hits, Store.read(data["documents"]), traces, conf.eval.context_passages)
            if conf.eval.llm_dry_run:
                msgs = [build_reader_messages(q, contexts.get(i, []), conf.eval.max_context_tokens)
                        for i, q in zip(questions["qid"], questions["question"])]
                estimate = client.dry_run_estimate(msgs, expected_completion_tokens=conf.llm.max_tokens)
                log.info("llm dry run: generation would make %s", estimate)
                return {"llm_dry_run": estimate}
            predictions, figures = generate(client, questions, contexts, conf.eval.max_context_tokens), {}
        scores = {**score_predictions(predictions, questions, client if conf.eval.llm_judge else None), **figures}
    finally:  # every stage's calls so far, failed ones included, also when generation fails
        for stage in client.ledger.stages():
            ctx.store.record_ledger(ctx.run_id, stage, client.ledger_summary(stage))
    write_parquet(predictions, Path(run_dir) / "predictions.parquet")
    ledger = client.ledger_summary()
    return {**{k: round(v, 2) if isinstance(v, float) else v for k, v in scores.items()},
            **{k: ledger[k] for k in ["prompt_tokens", "completion_tokens", "llm_calls", "llm_cache_hits"]}}


def report(metrics: dict[str, Any], split: pd.DataFrame) -> None:
    """Print the readable tables, then the machine-readable last line."""
    print("\nindex stages (this run)")
    print(stage_table(split))
    spread = [k for k in ("query_ms_p50", "query_ms_p95") if metrics.get(k) is not None]  # >= 5 timed batches
    keys = [k for k in metrics if k.startswith("recall@")] + ["query_ms_mean", *spread, "index_seconds"]
    keys += [k for k in metrics if k.startswith("evidence_recall@")] + (
        ["context_recall"] if metrics.get("context_recall") is not None else [])
    keys += [k for k in metrics if k.startswith("answer_in_context@")]
    keys += [k for k in metrics if k.startswith(("span_hit@", "span_in_context@", "doc_recall@", "result_chars@"))]
    keys += [k for k in ["em", "f1", "contain_acc", "accuracy", "recall", "llm_acc", "prompt_tokens", "completion_tokens"] if k in metrics]
    print(f"\n{metrics['method']} on {metrics['dataset']} ({metrics['n_questions']} questions, "
          f"{metrics['n_documents']} passages)")
    print(format_table([metrics], keys), flush=True)


def hydra_run_dir() -> str:
    """The Hydra output folder of this job."""
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def main(cfg: DictConfig) -> float:
    """Hydra entry point: resolve the config and run the flow once. Returns the dev-split objective
    (``eval.objective`` on ``metrics.dev``), the value a sweeper maximises; never a test-split score."""
    metrics = run_command(evaluate_flow, cfg, "metrics", hydra_run_dir())
    return float(metrics.get("dev", metrics).get(cfg.eval.objective, 0.0) or 0.0)


if __name__ == "__main__":
    sys.exit(main())
