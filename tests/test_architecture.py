"""The house's layout rules, checked on the source: imports go one way and never in a circle.

- ``flows`` → ``tasks`` → libraries: no ``tasks`` module imports ``flows``.
- Pure layers (a method's ``algorithm.py``, ``tasks/graph``) import no Prefect, no store and no
  Hydra, so they stay testable alone.
- No import circle between project modules, counting imports inside functions.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_modules() -> dict[str, Path]:
    return {_module_name(p): p for top in ("tasks", "flows") for p in (REPO / top).rglob("*.py")}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Every module ``path`` imports (at top level or inside functions), resolved to the longest known name."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        for name in names:
            while name and name not in modules and "." in name:
                name = name.rsplit(".", 1)[0]
            out.add(name)
    return out


def test_tasks_never_import_flows():
    modules = _project_modules()
    bad = {m: sorted(i for i in _imports(p, modules) if i.split(".")[0] == "flows")
           for m, p in modules.items() if m.startswith("tasks")}
    assert not {m: v for m, v in bad.items() if v}


def test_pure_layers_import_no_prefect_store_or_hydra():
    modules = _project_modules()
    pure = {m: p for m, p in modules.items() if m.endswith(".algorithm") or m.startswith("tasks.graph")}
    assert pure, "no pure modules found: the layout changed"
    forbidden = ("prefect", "hydra", "omegaconf", "tasks.core.store", "tasks.core.catalog", "tasks.core.files",
                 "tasks.core.locks", "tasks.core.row_cache", "tasks.core.stage", "duckdb")
    bad = {m: sorted(i for i in _imports(p, modules) if i.startswith(forbidden)) for m, p in pure.items()}
    assert not {m: v for m, v in bad.items() if v}


def test_no_import_cycles():
    modules = _project_modules()
    graph = {m: {i for i in _imports(p, modules) if i in modules and i != m and not m.startswith(i + ".")}
             for m, p in modules.items()}
    # a package's __init__ importing nothing of its children is the rule here; drop edges into parents
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert not cycles, f"import circles: {cycles}"
