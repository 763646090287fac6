"""``dagrag plan``: what a run would reuse and compute, checked against what the run then does.

The oracle is the run itself: after each plan the same overrides are indexed for real, and the run's stage events
(cached or computed, with their fingerprints and the rows each computed) must be exactly what the plan said.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.runtime.config import load_config
from flows.runtime.pipeline import index_flow, plan_run
from tasks.core.files import CATALOG
from tasks.core.plan import CACHED, COMPUTES
from tasks.core.store import Store
from tests.flows.conftest import make_config

REPO = Path(__file__).resolve().parents[3]
DOCS = {f"Note {i}": f"Note {i} records that the guild of {name} met in the {where} hall in year {1900 + i}."
        for i, (name, where) in enumerate(zip(
            ["Vell", "Ormand", "Tarsk", "Quill", "Brenn", "Ashby", "Corva", "Dunmore", "Elst", "Farro"],
            ["north", "south", "east", "west", "upper", "lower", "old", "new", "river", "hill"]))}


def write_corpus(folder: Path, docs: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for title, text in docs.items():
        (folder / f"{title}.txt").write_text(text)


def config(tmp_path: Path, method: str, *overrides: str) -> dict:
    return make_config(tmp_path, f"method={method}", "dataset=folder", f"dataset.path={tmp_path / 'corpus'}",
                       *overrides)


def plan_of(cfg: dict):
    return plan_run(load_config(cfg))


def states(plan) -> dict[tuple[str, str], str]:
    return {(s.stage, s.fp): s.state for s in plan.steps}


def run(cfg: dict) -> dict[tuple[str, str], tuple[str, int]]:
    """Index for real; its stage events: {(stage, fp): (cached | computed, rows computed)}."""
    summary = index_flow(cfg)
    events = Store(cfg["artifacts_dir"]).events(summary["run_id"])
    return {(r.stage, r.fp): ("cached" if r.status == "cached" else COMPUTES, int(r.rows_computed))
            for r in events.itertuples()}


def assert_run_matches(plan, events: dict) -> None:
    assert {k: v[0] for k, v in events.items()} == states(plan)
    for s in plan.steps:
        if s.new_rows is not None:
            assert events[(s.stage, s.fp)][1] == s.new_rows, s.stage


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    write_corpus(tmp_path / "corpus", DOCS)
    return tmp_path


def test_fresh_store_computes_everything_and_writes_nothing(corpus: Path):
    cfg = config(corpus, "dense")
    plan = plan_of(cfg)
    assert [(s.stage, s.state) for s in plan.steps] == [("read", COMPUTES), ("ingest", COMPUTES), ("embed", COMPUTES)]
    assert all(s.why.startswith("never built") for s in plan.steps)
    assert not (Path(cfg["artifacts_dir"]) / CATALOG).exists()  # a plan never creates a store
    events = run(cfg)
    assert_run_matches(plan, events)  # the fingerprints the plan gave are the ones the run computed


def test_cached_store_computes_nothing_and_shows_its_rows(corpus: Path):
    cfg = config(corpus, "dense")
    run(cfg)
    plan = plan_of(cfg)
    assert {s.state for s in plan.steps} == {CACHED}
    assert plan.summary().endswith("nothing computes")
    embed = next(s for s in plan.steps if s.stage == "embed")
    assert embed.rows == len(DOCS) and embed.bytes > 0 and embed.built_at
    assert_run_matches(plan, run(cfg))


def test_edited_param_computes_exactly_the_stages_that_read_it(corpus: Path):
    run(config(corpus, "hybrid"))
    edited = config(corpus, "hybrid", "method.k1=1.2")
    plan = plan_of(edited)
    by_stage = {s.stage: s for s in plan.steps}
    assert by_stage["bm25_index"].state == COMPUTES and "k1" in by_stage["bm25_index"].why
    assert by_stage["ingest"].state == by_stage["embed"].state == CACHED
    assert by_stage["bm25_index"].est_seconds is not None  # from the catalog's past compute of bm25_index
    assert_run_matches(plan, run(edited))


def test_grown_corpus_computes_only_the_new_rows(corpus: Path):
    cfg = config(corpus, "dense")
    run(cfg)
    write_corpus(corpus / "corpus", {"Note 10": "Note 10 records that the guild of Gale met in the far hall.",
                                     "Note 11": "Note 11 records that the guild of Hollis met in the near hall."})
    before_ingest = plan_of(cfg)  # the new documents are not ingested yet: how many rows is not known
    before = {s.stage: s for s in before_ingest.steps}
    assert [s.state for s in before_ingest.steps] == [COMPUTES, COMPUTES, COMPUTES]  # read, ingest, embed
    assert "new inputs" in before["ingest"].why and before["embed"].new_rows is None
    run(config(corpus, "bm25"))  # another method's run ingests the grown corpus
    plan = plan_of(cfg)
    by_stage = {s.stage: s for s in plan.steps}
    embed = by_stage["embed"]
    assert by_stage["read"].state == by_stage["ingest"].state == CACHED
    assert (embed.state, embed.new_rows, embed.total_rows) == (COMPUTES, 2, len(DOCS) + 2)
    assert embed.label == "computes 2 new rows"
    assert_run_matches(plan, run(cfg))


def test_damaged_file_is_named_and_only_its_stage_computes(corpus: Path):
    cfg = config(corpus, "bm25")
    run(cfg)
    plan = plan_of(cfg)
    index = next(s for s in plan.steps if s.stage == "bm25_index")
    path = Path(Store(cfg["artifacts_dir"]).lookup("bm25_index", index.fp)["bm25"].path)
    path.write_bytes(path.read_bytes()[:-7])  # a truncated file
    plan = plan_of(cfg)
    index = next(s for s in plan.steps if s.stage == "bm25_index")
    assert index.state == COMPUTES and index.why.startswith("damaged file") and str(path) in index.why
    assert_run_matches(plan, run(cfg))


def test_plan_command_prints_text_json_and_mermaid(corpus: Path):
    args = [sys.executable, "-m", "flows.cli", "plan", "method=dense", "dataset=folder",
            f"dataset.path={corpus / 'corpus'}", f"artifacts_dir={corpus / 'store'}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    text = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert text.returncode == 0, text.stderr
    assert "never built" in text.stdout and "3 stages: 0 cached, 3 compute" in text.stdout
    out = subprocess.run([*args, "plan.format=json"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    steps = json.loads(out.stdout)["steps"]
    assert [s["stage"] for s in steps] == ["read", "ingest", "embed"] and steps[2]["inputs"]["table"] == steps[1]["fp"]
    out = subprocess.run([*args, "plan.format=mermaid"], capture_output=True, text=True, env=env, cwd=REPO,
                         timeout=120)
    assert out.stdout.splitlines()[:2] == ["flowchart TD", "  %% stages of method=dense"]
    bad = subprocess.run([*args, "plan.format=svg"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert bad.returncode == 2 and "plan.format" in bad.stderr
    assert not (corpus / "store" / CATALOG).exists()


def test_open_index_with_build_says_what_it_will_compute_first(corpus: Path, capsys):
    """``query.build=true`` (``open_index(build=True)``) prints the plan of the index it is about to build."""
    from flows.serving.index import open_index

    cfg = config(corpus, "bm25")
    index = open_index(config=cfg, build=True)
    said = capsys.readouterr().err
    assert "building the index first" in said
    for step in plan_of(cfg).steps:  # now built: the steps it announced, by fingerprint
        assert f"[{step.fp}]" in said and step.state == CACHED
    assert "never built" in said and index.retrieve(["Which guild met in the river hall?"], k=1)[0]
