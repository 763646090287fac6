"""``flows.commands.growth``: a seeded share held out, real index and update processes, the table read back from the catalogs."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

import pandas as pd

from flows.commands.growth import SPLIT, growth_row, holdout_ids, markdown, passed_on, split_markdown, stage_note, update_split

REPO = Path(__file__).resolve().parents[3]


def test_the_held_out_documents_depend_on_the_ids_and_seed_not_on_corpus_order():
    ids = [f"d{i:03d}" for i in range(200)]
    held = holdout_ids(ids, 0.05, 17)
    assert len(held) == 10 and held <= set(ids)
    shuffled = ids[:]
    random.Random(3).shuffle(shuffled)
    assert holdout_ids(shuffled, 0.05, 17) == held
    assert holdout_ids(ids, 0.05, 18) != held
    # a grown corpus holds out its own share; at least one document, never all of them
    assert len(holdout_ids(ids[:3], 0.01, 0)) == 1 and len(holdout_ids(ids[:3], 0.99, 0)) == 2
    with pytest.raises(ValueError, match="at least 2"):
        holdout_ids(["only"], 0.5, 0)


def test_a_row_takes_medians_and_compares_with_the_build_scaled_to_the_full_corpus():
    corpora = {"n_base": 90, "n_full": 100, "n_added": 10}
    stages = [{"stage": "embed", "seconds": 2.0, "rows_computed": 10, "rows": 100},
              {"stage": "chunk", "seconds": 0.01, "rows_computed": 10, "rows": 100}]
    def split(x: float) -> dict[str, float]:
        return {k: x + i for i, k in enumerate(SPLIT)}

    updates = [{"wall_s": 9.0, "stage_s": 3.0, "fixed_s": 6.0, "stages": stages, "split": split(3.0)},
               {"wall_s": 7.0, "stage_s": 2.0, "fixed_s": 5.0, "stages": stages, "split": split(1.0)},
               {"error": "update failed (exit 1): boom"},
               {"wall_s": 8.0, "stage_s": 4.0, "fixed_s": 4.0, "stages": stages, "split": split(2.0)}]
    row = growth_row("m", corpora, 36.0, 45.0, updates)
    assert row["full_build_stage_s"] == 40.0 and row["full_build_wall_s"] == 50.0
    assert (row["update_wall_s"], row["update_stage_s"], row["update_fixed_s"]) == (8.0, 3.0, 5.0)
    assert row["pct_of_build_stages"] == 7.5 and row["pct_of_build_wall"] == 16.0
    assert row["failed_runs"] == 1 and row["update_stages"] == "embed 2.0 s (10/100), 1 more under 0.1 s"
    failed = growth_row("m", corpora, 36.0, 45.0, [{"error": "update stopped after 5 s"}])
    assert failed["error"] == "update stopped after 5 s"
    stored = growth_row("m", corpora, 36.0, None, updates)  # a base index found stored: no build wall time
    assert stored["pct_of_build_wall"] is None and stored["pct_of_build_stages"] == 7.5
    table = markdown([row, stored, {"method": "x", "error": "build failed (exit 1): MemoryError"}])
    assert table.count("\n") == 5 and "| x | build failed (exit 1): MemoryError |" in table
    assert "| m | 36.0 / 45.0 | 40.0 / 50.0 | 3.0 / 8.0 | 5.0 | 7.5 / 16.0 | embed 2.0 s" in table
    assert "| m | 36.0 / – | 40.0 / – | 3.0 / 8.0 | 5.0 | 7.5 / – |" in table
    assert row["update_split"] == split(2.0)  # each part's median over the runs that finished
    lines = split_markdown([row, failed]).splitlines()
    assert len(lines) == 3 and lines[2] == "| m | 2.0 | 3.0 | 4.0 | 5.0 | 6.0 | 7.0 | 8.0 |"  # the failed row: none
    assert stage_note([]) == ""
    assert stage_note(stages[:1], summaries=(3, 9)) == "3 of 9 summaries made anew; embed 2.0 s (10/100)"


def test_an_update_s_wall_time_splits_into_its_parts():
    stages = pd.DataFrame({"stage": ["ingest", "embed", "chunk", "erarag_hierarchy"], "seconds": [0.1, 2.0, 0.2, 3.0]})
    payload = {"startup_s": 2.5, "flow_s": 5.6, "timed": {
        "loading the ONNX Runtime encoder (fp32) from the model cache": 0.3, "checking x in bfloat16": 9.0}}
    got = update_split(10.0, payload, stages)
    assert got == pytest.approx({"startup_s": 2.5, "model_loading_s": 0.3, "per_row_s": 1.9, "whole_corpus_s": 3.1,
                                 "flow_other_s": 0.3, "after_flow_s": 1.9})
    # the parts add up to the wall time; a loading step with no per-row stage comes out of the whole-corpus ones
    assert sum(got.values()) == pytest.approx(10.0)
    only_whole = update_split(10.0, payload, stages[stages["stage"].isin(["ingest", "erarag_hierarchy"])])
    assert only_whole["per_row_s"] == 0 and only_whole["whole_corpus_s"] == pytest.approx(2.8)


def test_growth_builds_once_updates_fresh_copies_and_records_rows(tmp_path):
    out = subprocess.run([sys.executable, "-m", "flows.commands.growth", f"artifacts_dir={tmp_path}", "dataset.n_passages=60",
                          "dataset.n_questions=8", "growth.methods=[bm25,erarag]", "growth.repeats=2",
                          "growth.fraction=0.1"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("growth: ")
    result = json.loads(last[len("growth: "):])
    corpora = result["corpora"]
    assert (corpora["n_full"], corpora["n_added"], corpora["n_base"]) == (60, 6, 54)
    base = json.loads((Path(corpora["base_dir"]) / corpora["label"] / "corpus.json").read_text())
    full = json.loads((Path(corpora["full_dir"]) / corpora["label"] / "corpus.json").read_text())
    assert len(base) == 54 and len(full) == 60 and all(p in full for p in base)
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"bm25", "erarag"} and not any(r.get("error") for r in rows.values())
    for r in rows.values():
        assert len(r["runs_stage_s"]) == 2 and r["failed_runs"] == 0
        assert r["update_wall_s"] > r["update_stage_s"] > 0 and r["pct_of_build_stages"] > 0
    # EraRAG's update embeds the 6 new passages only (a per-row stage), then updates its graph (Alg. 3); every
    # repeat starts from a fresh copy of the base index, so each one computes them again
    assert "embed" in rows["erarag"]["update_stages"] and "(6/60)" in rows["erarag"]["update_stages"]
    assert rows["erarag"]["update_stages"].split(" of ")[0].isdigit() and "summaries made anew" in \
        rows["erarag"]["update_stages"] and "summaries" not in rows["bm25"]["update_stages"]
    assert all(s > 0.05 for s in rows["erarag"]["runs_stage_s"])
    root = tmp_path / "growth" / "growth"
    assert not (root / "update").exists()  # each update's copy is removed
    for method in ("bm25", "erarag"):  # a base store per method: the build pays every stage it uses
        with duckdb.connect(str(root / "base" / method / "catalog.duckdb"), read_only=True) as con:
            commands = {c for (c,) in con.execute("SELECT command FROM runs").fetchall()}
            n_docs = con.execute("SELECT rows FROM stages WHERE stage = 'ingest' AND name = 'documents'").fetchall()
        assert commands == {"index"} and n_docs == [(54,)]  # the updates ran on copies, never on the base
    assert rows["erarag"]["build_wall_s"] > rows["erarag"]["build_stage_s"]
    with duckdb.connect(str(tmp_path / "catalog.duckdb"), read_only=True) as con:
        recorded = con.execute("SELECT method, dataset FROM metrics WHERE kind = 'growth' ORDER BY method").fetchall()
    assert recorded == [("bm25", "sample-60-s0"), ("erarag", "sample-60-s0")]
    for r in rows.values():  # where the updates' wall seconds went: every part measured, all within the wall
        part = r["update_split"]
        assert set(part) == set(SPLIT) and part["startup_s"] > 0.5 and part["after_flow_s"] > 0
        assert part["per_row_s"] >= 0 and part["startup_s"] + part["after_flow_s"] < r["update_wall_s"]
    assert rows["bm25"]["update_split"]["model_loading_s"] == 0 < rows["erarag"]["update_split"]["model_loading_s"]
    table = Path(result["table"]).read_text()
    builds, where = table.split("Where each update's wall seconds went")
    assert builds.count("\n") == 5 and "| erarag |" in builds
    assert where.count("| bm25 |") == 1 and where.count("| erarag |") == 1


def test_growth_sets_the_corpus_method_and_store_itself_and_passes_the_rest_on():
    assert [o for o in ["method=bm25", "method.top_k=5", "dataset=hipporag", "dataset.name=x", "data_dir=d",
                        "artifacts_dir=a", "growth.repeats=1", "embedder.batch_size=8", "+llm.x=1"] if passed_on(o)] \
        == ["method.top_k=5", "embedder.batch_size=8", "+llm.x=1"]


@pytest.mark.parametrize("overrides, error", [
    (["growth.fraction=1.5"], "growth.fraction"),
    # a method key that one of the methods lacks: named, before the first build
    (["growth.methods=[erarag,bm25]", "method=erarag", "method.segment_avg=9"], "method=bm25 does not take"),
])
def test_a_bad_growth_config_stops_before_any_work(tmp_path, overrides, error):
    out = subprocess.run([sys.executable, "-m", "flows.commands.growth", f"artifacts_dir={tmp_path}", *overrides],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 2 and error in out.stderr, out.stderr[-2000:]
    assert not (tmp_path / "growth").exists() and not (tmp_path / "reports").exists()
