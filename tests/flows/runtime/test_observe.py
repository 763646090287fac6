"""The Prefect UI's view of a run: artifacts with stable keys, readable task-run names, a verdict line."""
from __future__ import annotations

import asyncio

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId

from flows.commands.benchmark import benchmark_flow
from flows.commands.evaluate import evaluate_flow
from flows.runtime.observe import artifact_key, observed, stage_markdown, tags_for, task_run_name, verdict
from tasks.core.store import ArtifactRef, Store
from tests.flows.conftest import make_config

SMALL = ["method=dense", "dataset=sample", "dataset.n_passages=40", "dataset.n_questions=6"]


def test_artifact_keys_are_lowercase_letters_digits_dashes():
    assert artifact_key("metrics", "zoomrag", "hotpotqa-100") == "metrics-zoomrag-hotpotqa-100"
    assert artifact_key("stages", "dense", "My_Corpus.v2 (notes)") == "stages-dense-my-corpus-v2-notes"


def test_task_run_names_say_what_a_row_stage_runs_over():
    docs = ArtifactRef("documents", "x", "fp", 3)
    chunks = ArtifactRef("chunks", "y", "fp", 9)
    assert task_run_name("embed", {"ctx": None, "table": docs, "id_col": "doc_id"}) == "embed[passages]"
    assert task_run_name("ner", {"table": chunks}) == "ner[chunks]"
    assert task_run_name("global_block", {"doc_doc": docs}) == "global_block"


def test_verdict_says_when_everything_was_cached():
    cached = [{"stage": s, "status": "cached", "rows_computed": 0} for s in ["ingest", "embed"]]
    assert verdict(cached) == "all 2 stages cached: nothing computed"
    grown = [{"stage": "ingest", "status": "computed", "rows_computed": 44},
             {"stage": "embed", "status": "computed", "rows_computed": 4}]
    assert verdict(grown) == "2 of 2 stages computed (ingest, embed), 48 rows computed"
    md = stage_markdown("index", "dense", "sample", [{**cached[0], "rows": 5, "seconds": 0.1, "peak_rss_mb": 0.0,
                                                       "llm_tokens": 0}], "completed")
    assert "| stage | status |" in md and "all 1 stages cached" in md


async def _artifacts(flow_run_id):
    async with get_client() as client:
        arts = await client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        run = await client.read_flow_run(flow_run_id)
        history = await client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["evaluate-metrics-dense-sample-40-s0"])))
    return arts, runs, run, history


def test_an_evaluate_run_publishes_metrics_and_stages_and_names_its_tasks(tmp_path):
    cfg = make_config(tmp_path, *SMALL)
    metrics = observed(evaluate_flow, cfg)(cfg, str(tmp_path / "run"))
    arts, task_runs, run, _ = asyncio.run(_artifacts(metrics["run_id"]))
    by_key = {a.key: a for a in arts}
    assert set(by_key) == {"evaluate-metrics-dense-sample-40-s0", "evaluate-stages-dense-sample-40-s0"}
    assert by_key["evaluate-metrics-dense-sample-40-s0"].type == "table"
    assert "recall@5" in by_key["evaluate-metrics-dense-sample-40-s0"].data
    stages = by_key["evaluate-stages-dense-sample-40-s0"].data
    assert by_key["evaluate-stages-dense-sample-40-s0"].type == "markdown" and "| embed | computed |" in stages
    assert "embed[passages]" in {t.name for t in task_runs}
    assert run.name == "evaluate dense/sample-40-s0"

    again = observed(evaluate_flow, cfg)(cfg, str(tmp_path / "run2"))
    arts, _, _, history = asyncio.run(_artifacts(again["run_id"]))
    stages = {a.key: a for a in arts}["evaluate-stages-dense-sample-40-s0"].data
    n_stages = sum(line.split("|")[2].strip() == "cached" for line in stages.splitlines() if line.count("|") > 3)
    assert n_stages >= 2 and f"all {n_stages} stages cached: nothing computed" in stages
    assert len(history) == 2  # one key, one version per run: the UI shows its history


def test_the_flow_run_carries_the_tags_and_its_task_runs_none(tmp_path):
    """The tags go on the flow run (the UI filters runs by them) and not on its task runs: a tagged task run
    asks the API for tag concurrency slots before it starts (``flows.runtime.observe.untagged_tasks``)."""
    from prefect import flow, tags, task
    from prefect.context import get_run_context

    from flows.runtime.pipeline import index_flow

    cfg = make_config(tmp_path, "method=bm25", "dataset=sample", "dataset.n_passages=40", "dataset.n_questions=6")
    want = {"method:bm25", "dataset:sample-40-s0"}
    assert set(tags_for(cfg)) == want
    with tags(*tags_for(cfg)):
        summary = observed(index_flow, cfg)(cfg)
    _, task_runs, run, _ = asyncio.run(_artifacts(summary["run_id"]))
    assert set(run.tags) == want
    assert len(task_runs) >= 2 and all(t.tags == [] for t in task_runs)

    @task
    def stage() -> None:
        return None

    @flow
    def plain() -> str:  # the control: a flow body not wrapped in untagged_tasks
        stage()
        return str(get_run_context().flow_run.id)

    with tags(*tags_for(cfg)):
        plain_id = plain()
    _, task_runs, _, _ = asyncio.run(_artifacts(plain_id))
    assert len(task_runs) == 1 and set(task_runs[0].tags) == want


def test_a_benchmark_run_publishes_its_latency_table(tmp_path):
    cfg = make_config(tmp_path, "method=bm25", "dataset=sample", "dataset.n_passages=40", "dataset.n_questions=6",
                      "benchmark.batch_sizes=[1,4]", "benchmark.n_questions=8")
    observed(benchmark_flow, cfg)(cfg)
    record = Store(cfg["artifacts_dir"]).query("SELECT run_id FROM metrics WHERE kind = 'benchmark'")
    arts, _, _, _ = asyncio.run(_artifacts(record["run_id"].iloc[0]))
    latency = {a.key: a for a in arts}["benchmark-latency-bm25-sample-40-s0"]
    assert latency.type == "table" and "ms_per_query_p95" in latency.data and '"batch_size": 4' in latency.data


async def _runs_named(name):
    from prefect.client.schemas.filters import FlowRunFilterName

    async with get_client() as client:
        runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
        return runs, [await client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[r.id])))
                      for r in runs]


def test_a_failed_run_still_publishes_its_stage_table(tmp_path):
    from flows.runtime.pipeline import index_flow

    bad = tmp_path / "broken.jsonl"
    bad.write_text('{"title": "a", "text": "fine"}\nnot json\n')
    cfg = make_config(tmp_path, "method=bm25", "dataset=jsonl", f"dataset.path={bad}", "dataset.name=broken-corpus")
    with pytest.raises(Exception):
        observed(index_flow, cfg)(cfg)
    runs, arts = asyncio.run(_runs_named("index bm25/broken-corpus"))
    assert [r.state.type.value for r in runs] == ["FAILED"]
    stages = {a.key: a for a in arts[0]}["index-stages-bm25-broken-corpus"]
    assert "index bm25 on broken-corpus: failed" in stages.data
