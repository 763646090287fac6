"""The README's headline results table is the one ``dagrag report report.headline=true`` rendered, and its
export holds the catalog's numbers.

``docs/results/headline.json`` is the export the report wrote beside the table: the run ids, commits, dates and
metrics of exactly the rows it rendered. The table in README.md and docs/results.md must be that export rendered
again (checked everywhere). Where ``DAGRAG_HEADLINE_CATALOG`` names a catalog (``artifacts_dir/catalog.duckdb``;
copy it first if a run may be writing it), each exported row must equal that catalog's metrics of its run id.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flows.methods import NAMES as METHOD_NAMES
from tasks.eval.headline import ANSWER, RECALL, between, headline_table

REPO = Path(__file__).resolve().parents[1]
EXPORT = json.loads((REPO / "docs" / "results" / "headline.json").read_text())
CATALOG = os.environ.get("DAGRAG_HEADLINE_CATALOG")


@pytest.mark.parametrize("page", ["README.md", "docs/results.md"])
def test_the_table_is_the_export_rendered(page):
    table = headline_table(EXPORT["rows"], EXPORT["methods"], EXPORT["datasets"])
    assert between((REPO / page).read_text()) == table, (
        f"{page}'s results table is not the one docs/results/headline.json renders: run `dagrag report "
        f"report.headline=true` (docs/results.md says on which runs) instead of editing it by hand")


def test_the_export_covers_every_method_dataset_and_experiment_once():
    keys = [(r["method"], r["dataset"], r["experiment"]) for r in EXPORT["rows"]]
    assert len(keys) == len(set(keys))
    assert set(keys) == {(m, d, e) for m in METHOD_NAMES for d in EXPORT["datasets"]
                         for e in ("paper", "beyond_paper")}
    assert EXPORT["methods"] == list(METHOD_NAMES)


@pytest.mark.skipif(not CATALOG, reason="needs DAGRAG_HEADLINE_CATALOG, a catalog.duckdb holding the exported runs "
                                        "(the store the compare runs wrote; CI has none)")
def test_the_export_matches_the_catalog():
    import duckdb

    ids = [r["run_id"] for r in EXPORT["rows"]]
    with duckdb.connect(CATALOG, read_only=True) as con:
        found = con.execute(f"SELECT m.run_id, m.method, m.dataset, m.metrics, r.manifest->>'git_sha' FROM metrics m "
                            f"JOIN runs r USING (run_id) WHERE m.kind = 'evaluate' AND m.run_id IN "
                            f"({', '.join('?' * len(ids))})", ids).fetchall()
    catalog = {run_id: (method, dataset, json.loads(metrics), sha) for run_id, method, dataset, metrics, sha in found}
    missing = sorted(set(ids) - set(catalog))
    assert not missing, f"{CATALOG} has no evaluate run {missing[:3]}…"
    for row in EXPORT["rows"]:
        method, dataset, metrics, sha = catalog[row["run_id"]]
        assert (row["method"], row["dataset"], row["experiment"], row["git_sha"]) == \
            (method, dataset, metrics.get("experiment"), sha), row["run_id"]
        assert [row[k] for k in RECALL] == [metrics[k] for k in RECALL], row["run_id"]
        assert row[ANSWER] == metrics.get(ANSWER), row["run_id"]
