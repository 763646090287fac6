"""flows.commands.report on a small catalog made here: the files exist, the figures are PNGs, the numbers match."""
from __future__ import annotations

import re

import pytest

from flows.commands.report import report_flow
from tasks.core.store import Store
from tests.flows.conftest import make_config
from tests.flows.small_catalog import COMMIT, DATASETS, METHODS, SWEEP, _metrics, _run, build_small_catalog

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def catalog(tmp_path):
    build_small_catalog(tmp_path / "artifacts")
    return tmp_path


def _rows(md: str) -> dict[tuple[str, str], dict[str, str]]:
    """The results table of report.md as {(dataset, method): {column: cell}}."""
    lines = [line for line in md.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == len(head) and "dataset" in head:
            row = dict(zip(head, cells))
            paper = row.get("experiment", "paper") == "paper"
            rows[(row["dataset"], row["method"]) if paper else (row["dataset"], row["method"], row["experiment"])] = row
    return rows


def test_latest_report_matches_the_catalog(catalog):
    result = report_flow(make_config(catalog))
    out = catalog / "artifacts" / "reports" / "latest"
    md = (out / "report.md").read_text()
    assert result["report"] == str(out / "report.md")
    png = (out / "accuracy_latency.png").read_bytes()
    assert png.startswith(PNG) and len(png) > 5000
    rows = _rows(md)
    first = next(iter(DATASETS))  # the latest run of each method, dataset and experiment, not the old ones
    assert set(rows) == {(d, m) for d in DATASETS for m in METHODS} | {(first, "zoomrag", "beyond_paper")}
    beyond = rows.pop((first, "zoomrag", "beyond_paper"))
    assert beyond["run_id"] == "run-zoomrag-beyond" and float(beyond["recall@5"]) == METHODS["zoomrag"] + 30
    aic = (out / "answer_in_context.png").read_bytes()
    assert aic.startswith(PNG) and len(aic) > 5000
    for (dataset, method), row in rows.items():
        r5 = METHODS[method] - 5.0 * list(DATASETS).index(dataset)
        assert float(row["recall@5"]) == r5 and float(row["recall@10"]) == r5 + 10
        assert float(row["evidence_recall@5"]) == r5 - 20 and float(row["context_recall"]) == r5 + 1
        assert row["run_id"] == f"run-{method}-{dataset}"
        assert float(row["index_build_s"]) == 5.0  # cached stages count at the cost they were built at
        assert float(row["ms/q@1"]) == (20.0 if method == "zoomrag" else 8.0) and float(row["ms/q@256"]) == 1.5
        assert float(row["peak_mem_mb"]) == 900.0 and row["em"] == "–"
        assert [float(row[f"answer_in_context@{b}"]) for b in (1000, 2000, 4000)] == [r5 - 8, r5 - 4, round(r5 - 8 / 3, 1)]
        assert row["answer_in_context_n"] == "18" and row["experiment"] == "paper"
    caption = re.search(r"\*recall@5 against ms per query.*\*", md).group(0)
    assert COMMIT[:10] in caption and all(h in caption for h in DATASETS.values())
    assert re.search(r"\d{4}-\d{2}-\d{2}", caption)


def test_a_run_that_found_its_index_cached_shows_the_peak_its_stages_had(catalog):
    """A run whose index stages were all cached measured no memory (its own index_peak_rss_mb is null); the
    table shows the peak those stages had when they were computed (400 MB here), not 0 or a blank."""
    store = Store(catalog / "artifacts")
    _run(store, "run-hybrid", "wiki-mini")  # ingest and embed: cached, recorded at 400 MB when built
    store.record_metrics("run-hybrid", "evaluate", "hybrid", "wiki-mini",
                         {**_metrics("hybrid", "wiki-mini", 65.0, "run-hybrid"), "index_peak_rss_mb": None})
    report_flow(make_config(catalog))
    row = _rows((catalog / "artifacts" / "reports" / "latest" / "report.md").read_text())[("wiki-mini", "hybrid")]
    assert float(row["peak_mem_mb"]) == 400.0 and row["ms/q@256"] == "–"  # no benchmark of hybrid
    assert float(row["index_build_s"]) == 5.0


def test_a_benchmark_lends_its_latency_only_to_runs_with_the_same_query_settings(catalog):
    """A newer zoomrag benchmark with method.alpha=0.7 does not replace the one with the evaluate run's own
    settings; a run whose settings no benchmark shares gets no ms/query (it got another setup's)."""
    store = Store(catalog / "artifacts")
    other = {"method": {"name": "zoomrag", "alpha": 0.7}}
    store.record_run("bench-alpha", "benchmark", {"git_sha": COMMIT, "config": other})
    store.record_metrics("bench-alpha", "benchmark", "zoomrag", "hotpot-mini",
                         {"rows": [{"batch_size": 1, "ms_per_query_mean": 99.0, "peak_rss_mb": 900.0}]})
    store.record_run("run-alpha", "evaluate", {"git_sha": COMMIT, "dataset_content_hash": DATASETS["wiki-mini"],
                                               "config": other})
    store.record_metrics("run-alpha", "evaluate", "zoomrag", "wiki-mini",
                         _metrics("zoomrag", "wiki-mini", 70.0, "run-alpha"))
    report_flow(make_config(catalog))
    rows = _rows((catalog / "artifacts" / "reports" / "latest" / "report.md").read_text())
    assert float(rows[("hotpot-mini", "zoomrag")]["ms/q@1"]) == 20.0  # its own setup's benchmark, not 99.0
    assert rows[("wiki-mini", "zoomrag")]["run_id"] == "run-alpha"
    assert rows[("wiki-mini", "zoomrag")]["ms/q@1"] == "–"  # only the default setup was benchmarked there


def test_sweep_report_shows_the_best_trial_on_the_test_split(catalog):
    result = report_flow(make_config(catalog, f"report.sweep={SWEEP}"))
    out = catalog / "artifacts" / "reports" / SWEEP
    md = (out / "report.md").read_text()
    assert len(result["runs"]) == 6
    assert (out / "sweep.png").read_bytes().startswith(PNG)
    assert "Best trial: 5 (method.alpha=0.8, method.top_k_docs=10)" in md
    rows = _rows(md.split("## Results")[1])
    assert list(rows) == [("hotpot-mini", "zoomrag")]
    # the results table holds the best trial's test score (45.0), never its dev score (68.0)
    assert float(rows[("hotpot-mini", "zoomrag")]["recall@5"]) == 45.0
    assert "heatmap" in md and COMMIT[:10] in md


def test_report_of_chosen_runs(catalog):
    report_flow(make_config(catalog, "report.runs=[old-dense-wiki-mini]", "report.name=one"))
    rows = _rows((catalog / "artifacts" / "reports" / "one" / "report.md").read_text())
    assert list(rows) == [("wiki-mini", "dense")] and float(rows[("wiki-mini", "dense")]["recall@5"]) == 15.0


def test_headline_writes_the_table_between_the_markers_and_its_export(catalog):
    """``report.headline=true``: the latest default-config run per method × dataset × experiment (a later run
    with a method override is not one), rendered between the markers of README.md and docs/results.md, and the
    rows it was rendered from in docs/results/headline.json, equal to the catalog's numbers."""
    import json

    from tasks.eval.headline import between, headline_table

    store = Store(catalog / "artifacts")
    tuned = "run-dense-tuned"  # newer than run-dense-hotpot-mini, but not at the defaults
    _run(store, tuned, "hotpot-mini")
    store.record_metrics(tuned, "evaluate", "dense", "hotpot-mini",
                         {**_metrics("dense", "hotpot-mini", 99.0, tuned), "overrides": {"method.top_k": "5"}})
    root = catalog / "checkout"
    (root / "docs").mkdir(parents=True)
    for rel in ("README.md", "docs/results.md"):
        (root / rel).write_text("# x\n\nbefore\n<!-- results:begin -->\nold\n<!-- results:end -->\nafter\n")
    cfg = make_config(catalog, "report.headline=true", f"report.headline_root={root}",
                      "report.headline_datasets=[hotpot-mini,wiki-mini]")
    result = report_flow(cfg)
    export = json.loads((root / "docs" / "results" / "headline.json").read_text())
    ids = sorted(r["run_id"] for r in export["rows"])
    assert ids == sorted([f"run-{m}-{d}" for m in METHODS for d in DATASETS] + ["run-zoomrag-beyond"])
    for row in export["rows"]:
        want = _metrics(row["method"], row["dataset"], METHODS[row["method"]] +
                        (30 if row["experiment"] == "beyond_paper" else 0), row["run_id"])
        assert [row[k] for k in ("recall@2", "recall@5", "recall@10", "answer_in_context@2000")] == \
            [want[k] for k in ("recall@2", "recall@5", "recall@10", "answer_in_context@2000")]
        assert row["git_sha"] == COMMIT
    table = headline_table(export["rows"], export["methods"], export["datasets"])
    for rel in ("README.md", "docs/results.md"):
        text = (root / rel).read_text()
        assert between(text) == table and text.startswith("# x\n\nbefore\n") and text.endswith("\nafter\n")
    assert "| zoomrag | 60.0 / 70.0 / 80.0 · 66.0 | 90.0 / 100.0 / 110.0 · 96.0 | 55.0 / 65.0 / 75.0 · 61.0 | – |" in table
    assert "| dense | 50.0 / 60.0 / 70.0 · 56.0 | – |" in table
    assert len(result["headline"]) == 3


def test_headline_refuses_a_page_without_its_markers(catalog):
    root = catalog / "checkout"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text("# no markers\n")
    (root / "docs" / "results.md").write_text("<!-- results:begin -->\n<!-- results:end -->\n")
    cfg = make_config(catalog, "report.headline=true", f"report.headline_root={root}",
                      "report.headline_datasets=[hotpot-mini,wiki-mini]")
    with pytest.raises(ValueError, match="README.md must hold <!-- results:begin -->"):
        report_flow(cfg)
