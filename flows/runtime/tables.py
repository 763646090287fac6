"""The plain tables a command prints: any rows, and the per-stage split of one run (seconds, rows, peak memory)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from tasks.core.store import Store


def stage_split(store: Store, run_id: str) -> pd.DataFrame:
    """Per-stage seconds, rows and peak memory of one run (cached stages show status 'cached').

    A stage that writes several tables shows each one's rows (``documents 300, gold 135``), not their sum.
    """
    ev = store.events(run_id)
    outputs = store.output_rows(run_id)
    several = {key: ", ".join(f"{n} {r}" for n, r in zip(g["name"], g["rows"]))
               for key, g in outputs.groupby(["stage", "fp"], sort=False) if len(g) > 1}
    rows = [several.get((s, fp), n) for s, fp, n in zip(ev["stage"], ev["fp"], ev["rows"])]
    return ev.assign(rows=rows)[["stage", "status", "rows", "rows_computed", "seconds", "peak_rss_mb"]]


def stage_table(split: pd.DataFrame) -> str:
    """:func:`stage_split` as the readable table every command prints."""
    return format_table(split.to_dict("records"), list(split.columns))


def stage_counts(split: pd.DataFrame) -> dict[str, Any]:
    """How many index stages ran (not cached) and the rows each stage computed, for a summary line."""
    return {"stages_computed": int((split["status"] == "computed").sum()),
            "rows_computed": split.groupby("stage", sort=False)["rows_computed"].sum().astype(int).to_dict()}


def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain fixed-width table."""
    cells = [[_fmt(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    body = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join([line, "-" * len(line), *body])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    return "" if v is None else str(v)
