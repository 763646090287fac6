"""Damaged stage outputs, row-cache parts, index files and the catalog, met by the evaluate flow and the doctor."""
from __future__ import annotations

import logging

import pytest

from flows.commands.doctor import doctor
from flows.commands.evaluate import evaluate_flow
from tasks.core.files import DamagedFile, StoreError
from tasks.core.store import Store
from tests.faults.conftest import (
    SMALL,
    built_store,
    copy_store,
    flip,
    make_config,
    quarantined,
    recall,
    row_part,
    stage_file,
    truncate,
)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A dense store of the small sample, and its metrics."""
    return built_store(tmp_path_factory, "method=dense", *SMALL)


def evaluate(tmp_path, *overrides: str, name: str = "run") -> dict:
    return evaluate_flow(make_config(tmp_path, *overrides, *SMALL), str(tmp_path / name))


def statuses(artifacts, run_id: str) -> dict[str, str]:
    return dict(Store(artifacts).events(run_id)[["stage", "status"]].itertuples(index=False))


def warnings_naming(caplog, path) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and str(path) in r.getMessage()]


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_a_truncated_or_deleted_stage_output_is_computed_again(clean, tmp_path, caplog, damage):
    """The issue's first case: a truncated output was trusted ("cached") as long as the file existed."""
    artifacts = copy_store(clean[0], tmp_path)
    target = stage_file(artifacts, "embed", "embeddings")
    truncate(target) if damage == "truncate" else target.unlink()
    caplog.set_level(logging.INFO, logger="dagrag")
    out = evaluate(tmp_path, "method=dense")
    assert statuses(artifacts, out["run_id"])["embed"] == "computed"
    assert len(warnings_naming(caplog, target)) == 1  # one log line names the file
    assert recall(out) == recall(clean[1])


def test_flipped_bytes_in_a_stage_output_stop_the_run_then_it_is_computed_again(clean, tmp_path):
    """Same size, intact footer: the page checksums find it when read; the file is quarantined, the run stops
    naming it and the fix, and the same command then computes it again (no crash loop)."""
    artifacts = copy_store(clean[0], tmp_path)
    target = stage_file(artifacts, "embed", "embeddings")
    flip(target)
    with pytest.raises(DamagedFile, match=f"{target}.*run the same command again"):
        evaluate(tmp_path, "method=dense")
    assert quarantined(artifacts) == [target.name]
    out = evaluate(tmp_path, "method=dense", name="again")
    assert statuses(artifacts, out["run_id"])["embed"] == "computed" and recall(out) == recall(clean[1])


@pytest.mark.parametrize("damage", [truncate, flip], ids=["truncate", "flip"])
def test_a_damaged_row_cache_part_is_dropped_and_its_rows_computed_again(clean, tmp_path, caplog, damage):
    """The issue's second case: one truncated part failed every new embed stage of the store. The stage output is
    removed too, so that the row cache is read."""
    artifacts = copy_store(clean[0], tmp_path)
    part = row_part(artifacts, "embed")
    damage(part)
    stage_file(artifacts, "embed", "embeddings").unlink()
    caplog.set_level(logging.INFO, logger="dagrag")
    out = evaluate(tmp_path, "method=dense")
    assert len(warnings_naming(caplog, part)) == 1 and quarantined(artifacts) == [part.name]
    events = Store(artifacts).events(out["run_id"]).set_index("stage")
    assert events.loc["embed", "rows_computed"] == 60  # every row again: they were all in that part
    assert recall(out) == recall(clean[1])


@pytest.mark.parametrize("damage", [truncate, flip], ids=["truncate", "flip"])
def test_a_damaged_index_file_is_computed_again_or_named(clean, tmp_path, damage):
    """A non-Parquet artifact (BM25's index, a tar): a wrong size is found before the stage is trusted; flipped
    bytes are found by its hash when it is read, and the file is quarantined."""
    artifacts = copy_store(clean[0], tmp_path)
    first = evaluate(tmp_path, "method=bm25", name="bm25")
    target = stage_file(artifacts, "bm25_index", "bm25")
    damage(target)
    if damage is flip:
        with pytest.raises(DamagedFile, match=f"{target}.*content hash"):
            evaluate(tmp_path, "method=bm25", name="stopped")
        assert quarantined(artifacts) == [target.name]
    out = evaluate(tmp_path, "method=bm25", name="again")
    assert statuses(artifacts, out["run_id"])["bm25_index"] == "computed" and recall(out) == recall(first)


def test_a_damaged_catalog_is_named_and_the_doctor_rebuilds_it(clean, tmp_path, capsys):
    """The issue's third case: half a catalog gave a 155-line duckdb traceback. The run now stops with one line
    that names the fix; the doctor rebuilds the catalog from the row caches; the run then gives the same metrics."""
    artifacts = copy_store(clean[0], tmp_path)
    Store(artifacts).query("SELECT 1")  # the copy's first session rewrites its paths
    truncate(artifacts / "catalog.duckdb")
    with pytest.raises(StoreError, match="catalog.*damaged.*doctor.repair=true"):
        evaluate(tmp_path, "method=dense")
    assert doctor(artifacts, repair=False) == 1
    assert doctor(artifacts, repair=True) == 0
    assert "catalog.duckdb" in quarantined(artifacts)
    out = evaluate(tmp_path, "method=dense", name="again")
    ev = Store(artifacts).events(out["run_id"]).set_index("stage")
    assert ev.loc["embed", "status"] == "computed" and ev.loc["embed", "rows_computed"] == 0  # rows from the cache
    assert recall(out) == recall(clean[1])
    assert doctor(artifacts, repair=False) == 0  # the stage files the old catalog named are now its again


def test_the_doctor_finds_by_hash_what_a_run_cannot_and_repairs_it(clean, tmp_path, capsys):
    """Bytes flipped in a Parquet footer's neighbourhood keep its size and footer; only the full hash sees them.
    The doctor exits 1 while damage is left, quarantines with repair, and the next run computes the stage again."""
    artifacts = copy_store(clean[0], tmp_path)
    assert doctor(artifacts, repair=False) == 0
    assert "healthy" in capsys.readouterr().out
    target = stage_file(artifacts, "ingest", "documents")
    flip(target, n=16, at=0.3)
    assert doctor(artifacts, repair=False) == 1
    assert f"{target.relative_to(artifacts)}" in capsys.readouterr().out
    assert doctor(artifacts, repair=True) == 0 and quarantined(artifacts) == [target.name]
    assert doctor(artifacts, repair=False) == 0
    out = evaluate(tmp_path, "method=dense")
    assert statuses(artifacts, out["run_id"])["ingest"] == "computed" and recall(out) == recall(clean[1])


def test_zoomrag_recomputes_a_truncated_graph_and_its_block(tmp_path_factory, tmp_path, caplog):
    """The issue's ZoomRAG case: a truncated doc–doc graph was trusted, and a truncated global block failed every
    later run. Both are computed again, to the clean run's metrics."""
    clean_dir, clean_metrics = built_store(tmp_path_factory, "method=zoomrag", *SMALL)
    artifacts = copy_store(clean_dir, tmp_path)
    graph, block = stage_file(artifacts, "doc_doc_graph", "doc_doc"), stage_file(artifacts, "global_block", "M")
    truncate(graph)
    truncate(block, keep=0.9)
    caplog.set_level(logging.INFO, logger="dagrag")
    out = evaluate(tmp_path, "method=zoomrag")
    status = statuses(artifacts, out["run_id"])
    assert status["doc_doc_graph"] == status["global_block"] == "computed" and status["ner"] == "cached"
    assert warnings_naming(caplog, graph) and warnings_naming(caplog, block)
    assert recall(out) == recall(clean_metrics)


def test_the_doctor_removes_dangling_rows_and_leaves_orphans_alone(clean, tmp_path, capsys):
    """A deleted output is a dangling row (exit 1 until repaired: its stage's rows go, so the next run computes
    it); a killed write's temp file and an unrecorded stage file are orphans: reported, left, not damage."""
    artifacts = copy_store(clean[0], tmp_path)
    gone = stage_file(artifacts, "embed", "embeddings")
    gone.unlink()
    stray = gone.with_name(f".{gone.name}.{'0' * 32}.tmp")
    stray.write_bytes(b"half a write")
    assert doctor(artifacts, repair=False) == 1
    report = capsys.readouterr().out
    assert "dangling catalog row" in report and stray.name in report
    assert doctor(artifacts, repair=True) == 0 and stray.exists()
    assert Store(artifacts).lookup("embed", gone.stem.rsplit("-", 1)[1]) is None
    assert doctor(artifacts, repair=False) == 0
