"""What a run would do, without doing it: each stage's fingerprint and whether it is cached or computes, and why.

A plan is a run in plan mode (:attr:`tasks.core.stage.RunContext.plan`): the command's own flow code walks its
stage DAG, every stage is called as a plain function (:class:`tasks.core.stage.StageTask`), fingerprinted and
looked up in the catalog, and :func:`tasks.core.stage.run_named_stage` hands it here instead of computing it.
A stage found is *cached* (its catalog row's outputs); one that is not *computes*, with the reason read from the
catalog (:meth:`Plan.why`), and its outputs are placeholders carrying the fingerprint it will have, so the stages
after it are fingerprinted exactly as the run would fingerprint them. A per-row stage whose input is built counts
the rows its row cache lacks (*computes N new rows*).

The estimates are the catalog's past computes of the same stage (seconds and bytes per row, the median over its
past versions, this dataset first), times the rows it will compute: a guide read from history, never a promise,
and absent where the stage never ran here. Beyond the papers (an engineering aid, like DVC's ``status`` or
Terraform's ``plan``).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from tasks.core.files import CATALOG, file_problem
from tasks.core.store import ArtifactRef, Store

CACHED, COMPUTES = "cached", "computes"
FORMATS = ("text", "json", "mermaid")


@dataclass
class Step:
    """One stage of a plan."""

    stage: str
    fp: str
    state: str                         # cached | computes
    why: str                           # for computes: never built, changed params, new inputs, new code, damaged file
    inputs: dict[str, str]             # input name -> fingerprint (the stages it reads)
    outputs: list[str]                 # its output tables (known once it ran on this store)
    rows: int | None = None            # cached: rows of its outputs
    bytes: int | None = None           # cached: bytes of its outputs
    built_at: str | None = None        # cached: when its catalog row was written
    new_rows: int | None = None        # per-row stage: rows its row cache lacks (None: not known before its input)
    total_rows: int | None = None      # per-row stage: rows of its input
    est_seconds: float | None = None   # computes: from the catalog's past runs (None: no past run)
    est_bytes: int | None = None
    of: str = ""                       # what it runs over, where its params say (an embed's id column)

    @property
    def label(self) -> str:
        if self.state == CACHED:
            return CACHED
        if self.new_rows is not None:
            return f"computes {self.new_rows} new rows"
        return COMPUTES


@dataclass
class Plan:
    """The steps a run would take, in the order it reaches them; :meth:`text`, :meth:`json` or :meth:`mermaid`."""

    artifacts_dir: str
    dataset: str
    title: str = ""
    steps: list[Step] = field(default_factory=list)

    # ------------------------------------------------------------------ building it (tasks.core.stage calls these)

    def _store(self) -> Store | None:
        """The store, when it has a catalog (a plan never creates one)."""
        return Store(self.artifacts_dir) if (Path(self.artifacts_dir) / CATALOG).is_file() else None

    def planned(self, fp: str) -> bool:
        """Whether the stage with this fingerprint computes in this plan (its outputs are not there yet)."""
        return any(s.fp == fp and s.state == COMPUTES for s in self.steps)

    def add(self, stage: str, fp: str, params: Any, inputs: Mapping[str, str],
            new_rows: Callable[[Store], tuple[int, int]] | None = None) -> dict[str, ArtifactRef]:
        """Plan one stage: its step (once per fingerprint), and the refs the stages after it are given."""
        store = self._store()
        hit = store.lookup(stage, fp, warn=False) if store is not None else None
        known = next((s for s in self.steps if s.fp == fp and s.stage == stage), None)
        if known is None:
            known = self._step(store, stage, fp, params, dict(inputs), hit, new_rows)
            known.of = str(params.get("id_col", "")) if isinstance(params, Mapping) else ""
            self.steps.append(known)
        if hit is not None:
            return hit
        return {name: ArtifactRef(name, "", fp, 0) for name in known.outputs} if known.outputs else _Planned(fp)

    def _step(self, store: Store | None, stage: str, fp: str, params: Any, inputs: dict[str, str],
              hit: Mapping[str, ArtifactRef] | None, new_rows: Callable[[Store], tuple[int, int]] | None) -> Step:
        if hit is not None:
            rows = _frame(store, "SELECT name, rows, bytes, created_at FROM stages WHERE stage = ? AND fp = ?",
                          [stage, fp])
            return Step(stage, fp, CACHED, "", inputs, sorted(hit), rows=int(rows["rows"].sum()),
                        bytes=int(rows["bytes"].fillna(0).sum()), built_at=str(rows["created_at"].max())[:19])
        history = self._history(store, stage)
        outputs = sorted(set(history["name"])) if history is not None and len(history) else []
        step = Step(stage, fp, COMPUTES, self.why(store, stage, fp, params, inputs, history), inputs, outputs)
        if new_rows is not None and store is not None and not any(self.planned(v) for v in inputs.values()):
            step.new_rows, step.total_rows = new_rows(store)
        step.est_seconds, step.est_bytes = self._estimate(history, step)
        return step

    def _history(self, store: Store | None, stage: str) -> Any:
        """This stage's catalog rows on any dataset, newest first (None: no catalog)."""
        if store is None:
            return None
        return _frame(store, "SELECT name, fp, dataset, input_fps, params, rows, rows_computed, seconds, bytes, "
                             "path, created_at FROM stages WHERE stage = ? ORDER BY created_at DESC", [stage])

    def why(self, store: Store | None, stage: str, fp: str, params: Any, inputs: Mapping[str, str],
            history: Any) -> str:
        """Why a stage that is not in the catalog computes, from its past versions on this dataset."""
        if store is not None:
            damaged = _frame(store, "SELECT path, rows, bytes FROM stages WHERE stage = ? AND fp = ?", [stage, fp])
            for path, rows, size in damaged.itertuples(index=False):
                problem = file_problem(path, None if size != size else size, rows)  # NaN: no size recorded
                if problem is not None:
                    return f"damaged file: {path} {problem}"
        if "?" in inputs.values():  # tasks.core.stage.UNKNOWN_INPUT
            return "its fingerprint reads an input computed in this plan (known once that input is built)"
        if history is None or not len(history[history["dataset"] == self.dataset]):
            return f"never built on {self.dataset}"
        mine = history[history["dataset"] == self.dataset].drop_duplicates("fp")
        versions = [(json.loads(p), json.loads(i)) for p, i in zip(mine["params"], mine["input_fps"])]
        plain = json.loads(json.dumps(params, default=str))
        same = [i for p, i in versions if p == plain]
        if not same:
            old = versions[0][0]
            changed = sorted(k for k in set(old) | set(plain) if old.get(k) != plain.get(k))
            return "changed params: " + ", ".join(f"{k} {old.get(k)!r} → {plain.get(k)!r}" for k in changed)
        if any(i == dict(inputs) for i in same):
            return "new code identity (its code or a function it calls changed)"
        last = same[0]
        moved = sorted(k for k in set(last) | set(inputs) if last.get(k) != inputs.get(k))
        rows = [k for k in moved if k == "_rows"]
        named = [k for k in moved if k != "_rows"]
        parts = [f"new inputs: {', '.join(named)}" + (" (computed in this plan)" if any(
            self.planned(inputs.get(k, "")) for k in named) else "")] if named else []
        if rows:
            parts.append("new row code identity")
        return "; ".join(parts)

    def _estimate(self, history: Any, step: Step) -> tuple[float | None, int | None]:
        """Seconds and bytes from the past computes of this stage (this dataset's first), scaled by rows."""
        if history is None or not len(history):
            return None, None
        per_fp = history.groupby("fp", sort=False).agg(dataset=("dataset", "first"), rows=("rows", "max"),
                                                       rows_computed=("rows_computed", "max"),
                                                       seconds=("seconds", "max"), bytes=("bytes", "sum"))
        per_fp = per_fp[per_fp["rows_computed"] > 0]
        if not len(per_fp):
            return None, None
        mine = per_fp[per_fp["dataset"] == self.dataset]
        use = mine if len(mine) else per_fp
        s_per_row = statistics.median((use["seconds"] / use["rows_computed"]).tolist())
        b_per_row = statistics.median((use["bytes"].fillna(0) / use["rows"].clip(lower=1)).tolist())
        if step.new_rows is not None:
            todo, total = step.new_rows, step.total_rows or step.new_rows
        else:
            todo = total = int(mine["rows"].iloc[0]) if len(mine) else int(use["rows"].median())
        return round(s_per_row * todo, 2), int(b_per_row * total)

    # ------------------------------------------------------------------ reading it

    @property
    def computing(self) -> list[Step]:
        return [s for s in self.steps if s.state == COMPUTES]

    def summary(self) -> str:
        """One line: how many stages are cached and compute, and the estimate."""
        todo = self.computing
        if not todo:
            return f"{len(self.steps)} stages, all cached: nothing computes"
        secs = [s.est_seconds for s in todo if s.est_seconds is not None]
        disk = [s.est_bytes for s in todo if s.est_bytes is not None]
        unknown = len(todo) - len(secs)
        est = (f"; about {sum(secs):.0f} s and {_mb(sum(disk))} from past runs" if secs else "; no past run to estimate from")
        return (f"{len(self.steps)} stages: {len(self.steps) - len(todo)} cached, {len(todo)} compute{est}"
                + (f" ({unknown} with no past run)" if unknown and secs else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "artifacts_dir": self.artifacts_dir, "dataset": self.dataset,
                "summary": self.summary(), "steps": [{**asdict(s), "label": s.label} for s in self.steps]}

    def json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def text(self) -> str:
        """A table a person reads: stage, fingerprint, state, then why or its catalog row."""
        lines = [self.title] if self.title else []
        width = max([len(s.stage) for s in self.steps] + [5])
        for s in self.steps:
            if s.state == CACHED:
                detail = f"{s.rows} rows, {_mb(s.bytes or 0)}, built {s.built_at}"
            else:
                est = (f"; ~{s.est_seconds:.1f} s, ~{_mb(s.est_bytes or 0)}" if s.est_seconds is not None
                       else "; no past run to estimate from")
                of = f" of {s.total_rows}" if s.new_rows is not None else ""
                detail = f"{s.why}{of and f' ({s.new_rows}{of} rows)'}{est}"
            lines.append(f"  {s.stage:<{width}}  [{s.fp}]  {s.label:<22}  {detail}")
        lines.append(self.summary())
        return "\n".join(lines)

    def mermaid(self, comment: str = "") -> str:
        """The stage DAG as a mermaid flowchart: one box per stage (its name), an arrow per input it reads."""
        node = {s.fp: f"s{i}" for i, s in enumerate(self.steps)}
        lines = ["flowchart TD"] + ([f"  %% {comment}"] if comment else [])
        for s in self.steps:
            lines.append(f'  {node[s.fp]}["{s.stage}{s.of and f" ({s.of})"}"]')
        edges = []
        for s in self.steps:
            for name, fp in s.inputs.items():
                if fp in node and (node[fp], node[s.fp]) not in edges:
                    edges.append((node[fp], node[s.fp]))
        lines += [f"  {a} --> {b}" for a, b in edges]
        return "\n".join(lines)

    def render(self, fmt: str) -> str:
        if fmt not in FORMATS:
            raise ValueError(f"plan.format={fmt!r} is not one of {', '.join(FORMATS)}")
        return {"text": self.text, "json": self.json, "mermaid": self.mermaid}[fmt]()


class _Planned(dict):
    """The outputs of a stage that computes and never ran on this store: any output name, this fingerprint."""

    def __init__(self, fp: str) -> None:
        super().__init__()
        self.fp = fp

    def __missing__(self, name: str) -> ArtifactRef:
        ref = self[name] = ArtifactRef(name, "", self.fp, 0)
        return ref


def _frame(store: Store, sql: str, params: list) -> Any:
    return store.query(sql, params)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
