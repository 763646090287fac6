"""The headline results table of the README and ``docs/results.md``: rows exported from the catalog → Markdown.

``dagrag report report.headline=true`` (``flows/commands/report.py``) picks the runs, writes their rows to
``docs/results/headline.json`` and renders them with :func:`headline_table` between the markers below in
``README.md`` and ``docs/results.md``. ``tests/test_results_table.py`` renders the export again and compares.
"""
from __future__ import annotations

import re
from typing import Any

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
RECALL = ("recall@2", "recall@5", "recall@10")
ANSWER = "answer_in_context@2000"   # the LLM-free measure on what the reader gets (Measures page), where present
EXPERIMENTS = ("paper", "beyond_paper")
COMMAND = "dagrag report report.headline=true"  # the command the table's note names


def cell(row: dict[str, Any] | None) -> str:
    """``62.5 / 78.5 / 85.0 · 81.3``: recall@2/5/10, then answer_in_context@2000 where the run has it."""
    if row is None:
        return "–"
    text = " / ".join(f"{row[k]:.1f}" for k in RECALL)
    return text + (f" · {row[ANSWER]:.1f}" if row.get(ANSWER) is not None else "")


def headline_table(rows: list[dict[str, Any]], methods: list[str], datasets: list[str]) -> str:
    """One line per method, one column per dataset × experiment, and a note naming commits and dates."""
    by = {(r["method"], r["dataset"], r["experiment"]): r for r in rows}
    columns = [(d, e) for d in datasets for e in EXPERIMENTS]
    lines = ["| method | " + " | ".join(f"{d}, {e}" for d, e in columns) + " |",
             "|---|" + "---|" * len(columns)]
    lines += [f"| {m} | " + " | ".join(cell(by.get((m, d, e))) for d, e in columns) + " |" for m in methods]
    commits = ", ".join(sorted({r["git_sha"][:7] for r in rows if r.get("git_sha")})) or "unknown"
    dates = sorted(r["created_at"][:10] for r in rows if r.get("created_at"))
    when = dates[0] if dates and dates[0] == dates[-1] else (f"{dates[0]} to {dates[-1]}" if dates else "unknown")
    lines += ["", f"recall@2 / 5 / 10 · {ANSWER} (%, no LLM). {len(rows)} runs of commit {commits}, {when}; "
              f"their run ids are in `docs/results/headline.json`. Made by `{COMMAND}`."]
    return "\n".join(lines)


def replace_between(text: str, table: str, where: str) -> str:
    """``text`` with everything between the two markers replaced by ``table``; an error naming ``where`` when
    the markers are not there exactly once each."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"{where} must hold {BEGIN} and then {END}, once each: put them where the results "
                         f"table goes")
    return re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: f"{BEGIN}\n{table}\n{END}", text,
                  flags=re.S)


def between(text: str) -> str:
    """What stands between the markers (the rendered table), without the newlines next to them."""
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")
