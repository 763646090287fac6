"""tasks.eval.headline: the headline table's cells, layout and markers."""
from __future__ import annotations

import pytest

from tasks.eval.headline import BEGIN, END, between, cell, headline_table, replace_between


def _row(method, dataset, experiment, r2, answer=None, sha="0123456789abcdef", day="2026-11-28 07:00:00"):
    return {"run_id": f"{method}-{dataset}-{experiment}", "method": method, "dataset": dataset,
            "experiment": experiment, "git_sha": sha, "created_at": day, "recall@2": r2, "recall@5": r2 + 10,
            "recall@10": r2 + 20, "answer_in_context@2000": answer}


def test_cell_rounds_and_adds_the_answer_measure_only_where_present():
    assert cell(_row("dense", "d", "paper", 62.456, 81.25)) == "62.5 / 72.5 / 82.5 · 81.2"
    assert cell(_row("dense", "d", "paper", 50.0)) == "50.0 / 60.0 / 70.0"
    assert cell(None) == "–"


def test_table_has_a_line_per_method_a_column_per_dataset_and_experiment():
    rows = [_row("bm25", "a", "paper", 10.0), _row("bm25", "b", "beyond_paper", 20.0, sha="fedcba9876543210",
                                                  day="2026-11-27 09:00:00")]
    table = headline_table(rows, ["bm25", "dense"], ["a", "b"]).splitlines()
    assert table[0] == "| method | a, paper | a, beyond_paper | b, paper | b, beyond_paper |"
    assert table[2] == "| bm25 | 10.0 / 20.0 / 30.0 | – | – | 20.0 / 30.0 / 40.0 |"
    assert table[3] == "| dense | – | – | – | – |"
    assert "2 runs of commit 0123456, fedcba9, 2026-11-27 to 2026-11-28" in table[-1]


def test_replace_between_keeps_the_rest_and_refuses_missing_markers():
    text = f"a\n{BEGIN}\nold\n{END}\nb\n"
    new = replace_between(text, "| t |", "X.md")
    assert new == f"a\n{BEGIN}\n| t |\n{END}\nb\n" and between(new) == "| t |"
    assert replace_between(new, "| t |", "X.md") == new
    with pytest.raises(ValueError, match="X.md must hold"):
        replace_between("no markers", "| t |", "X.md")
    with pytest.raises(ValueError, match="once each"):
        replace_between(text + text, "| t |", "X.md")
