"""The house's layout rules, checked on the source: imports go one way and never in a circle.

- ``flows`` → ``tasks`` → libraries: no ``tasks`` module imports ``flows``.
- Pure layers (a method's ``algorithm.py``, ``tasks/graph``) import no Prefect, no store and no
  Hydra, so they stay testable alone.
- No import circle between project modules, counting imports inside functions.
- Folders are layered (:data:`LAYERS`): ``core`` ← ``graph`` ← ``text`` ← ``data`` ← ``llm`` ← ``eval`` ← ``methods`` ←
  ``flows``; a folder imports only the folders below it (counting imports inside functions), so no two folders
  import each other, directly or round a loop. ``graph`` and ``text`` are one layer, the generic graph algorithms
  and the text tools: ``text`` may use ``graph``, never the other way.
"""
from __future__ import annotations

import ast
import sys
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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (its strongly connected components of more than one node)."""
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
    return cycles


def test_no_import_cycles():
    modules = _project_modules()
    graph = {m: {i for i in _imports(p, modules) if i in modules and i != m and not m.startswith(i + ".")}
             for m, p in modules.items()}
    # a package's __init__ importing nothing of its children is the rule here; drop edges into parents
    cycles = _cycles(graph)
    assert not cycles, f"import circles: {cycles}"


# each folder and the folders it may import: the store and stage machinery, generic graph algorithms, text tools,
# a corpus's readers, splitting and ingest (data: it counts tokens with the embedder's tokenizer, from text),
# the LLM client and its prompts, evaluation, the methods; then flows/: each method's DAG and record, the runtime
# every command runs on, a built index opened for questions, that index in other libraries (LangChain, LlamaIndex,
# MCP), the commands, and the console script over them
_TASKS = frozenset({"core", "graph", "text", "data", "llm", "eval", "methods"})
LAYERS: dict[str, frozenset[str]] = {
    "core": frozenset(),
    "graph": frozenset({"core"}),
    "text": frozenset({"core", "graph"}),
    "data": frozenset({"core", "graph", "text"}),
    "llm": frozenset({"core", "graph", "text", "data"}),
    "eval": frozenset({"core", "graph", "text", "data", "llm"}),
    "methods": frozenset({"core", "graph", "text", "data", "llm", "eval"}),
    "flows/methods": _TASKS,
    "flows/runtime": _TASKS | {"flows/methods"},
    "flows/serving": _TASKS | {"flows/methods", "flows/runtime"},
    "flows/integrations": _TASKS | {"flows/methods", "flows/runtime", "flows/serving"},
    "flows/commands": _TASKS | {"flows/methods", "flows/runtime", "flows/serving", "flows/integrations"},
    "flows": _TASKS | {"flows/methods", "flows/runtime", "flows/serving", "flows/integrations", "flows/commands"},
}


def _folder(module: str) -> str | None:
    """``flows/<sub-package>`` (or ``flows`` for its top modules) for a flows module, ``tasks/<folder>``'s name
    for a tasks module (None: ``tasks`` itself)."""
    top, _, rest = module.partition(".")
    if top == "flows":
        sub = rest.split(".")[0]
        return f"flows/{sub}" if "." in rest or f"flows/{sub}" in LAYERS and rest == sub and _is_package(module) \
            else "flows"
    return rest.split(".")[0] or None


def _is_package(module: str) -> bool:
    return (REPO / module.replace(".", "/") / "__init__.py").exists()


def _folder_imports(modules: dict[str, Path]) -> dict[str, dict[str, list[str]]]:
    """``{folder: {folder it imports: the module imports behind that arrow}}`` (imports inside functions too)."""
    out: dict[str, dict[str, list[str]]] = {}
    for m, p in modules.items():
        src = _folder(m)
        for i in _imports(p, modules):
            dst = _folder(i) if i in modules else None
            if src and dst and dst != src:
                out.setdefault(src, {}).setdefault(dst, []).append(f"{m} -> {i}")
    return out


def test_every_folder_has_a_layer():
    folders = {_folder(m) for m in _project_modules()} - {None}
    assert folders == set(LAYERS), f"place the new folder in LAYERS: {sorted(folders ^ set(LAYERS))}"


def test_folders_import_only_the_layers_below():
    upward = {f"{src} -> {dst}": sorted(why) for src, targets in _folder_imports(_project_modules()).items()
              for dst, why in targets.items() if dst not in LAYERS[src]}
    assert not upward, f"imports pointing up the layers (move the code to the layer it belongs to): {upward}"


def test_no_import_loop_between_folders():
    graph = {src: set(targets) for src, targets in _folder_imports(_project_modules()).items()}
    for targets in list(graph.values()):
        for dst in targets:
            graph.setdefault(dst, set())
    assert not _cycles(graph), f"folder import loops: {_cycles(graph)}"


def test_the_layer_rule_sees_function_level_imports(tmp_path):
    """A function-local import counts: an upward one hidden in a function body is still an arrow up."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from tasks.methods import dense\n    return dense\n")
    modules = {**_project_modules(), "tasks.core.probe": probe}
    assert "tasks.core.probe -> tasks.methods.dense" in _folder_imports(modules)["core"]["methods"]


def _library_names(tree: ast.AST) -> set[str]:
    """Names a module binds to an installed library's module or object (``from prefect import Task``, ``import
    pandas as pd``): anything imported from outside ``tasks``, ``flows`` and the standard library (whose process
    state, ``sys.argv``, a command may set)."""
    own = {"tasks", "flows", *sys.stdlib_module_names}
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] not in own}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] not in own:
            out |= {a.asname or a.name for a in node.names}
    return out


def library_patches(source: str) -> list[str]:
    """Where ``source`` assigns an attribute of a library's module or class (``Task.__call__ = …``,
    ``setattr(Task, "submit", …)``): patching a library at run time, which changes it for the whole process."""
    tree = ast.parse(source)
    libraries, found = _library_names(tree), []

    def root(node: ast.AST) -> str | None:
        while isinstance(node, ast.Attribute):
            node = node.value
        return node.id if isinstance(node, ast.Name) else None

    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            targets = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("setattr", "delattr") and node.args:
            targets = [ast.Attribute(node.args[0], "?")]
        found += [f"line {t.lineno if hasattr(t, 'lineno') else node.lineno}: {ast.unparse(t)}"
                  for t in targets if isinstance(t, ast.Attribute) and root(t) in libraries]
    return found


def test_no_code_patches_a_library_at_run_time():
    """A stage's run mode is the stage object's own (tasks.core.stage.StageTask), never a patched Prefect class."""
    bad = {str(p.relative_to(REPO)): hits for top in ("tasks", "flows") for p in sorted((REPO / top).rglob("*.py"))
           if (hits := library_patches(p.read_text()))}
    assert not bad, f"library objects patched at run time: {bad}"


def test_the_patch_check_finds_the_old_monkeypatch():
    old = ("def install():\n    from prefect import Task\n    call = Task.__call__\n"
           "    Task.__call__, Task.submit = call, call\n")
    assert library_patches(old) == ["line 4: Task.__call__", "line 4: Task.submit"]
    assert library_patches("import prefect\nsetattr(prefect.Task, 'map', None)\n")
    assert not library_patches("from prefect import Task\nclass Mine:\n    pass\nx = Mine()\nx.submit = 1\n")


# ----------------------------------------------------------------------------- one shape per method

METHOD_FILES = ("params.py", "stages.py", "algorithm.py", "retriever.py")
PROJECTIONS = "_params"  # ner_params(cfg, ...), kg_params(cfg), hierarchy_params(cfg): a stage's params, like Params.of


def test_every_method_has_the_same_files_and_its_params_in_params_py():
    """``tasks/methods/<m>/`` holds params.py, stages.py, algorithm.py and retriever.py for every registered method;
    its ``METHOD`` record's params class and its own stages' params classes are defined in its params.py, and its
    own stages in its stages.py."""
    from flows.methods import METHODS, NAMES
    from tasks.core.stage import STAGES

    missing = {m: [f for f in METHOD_FILES if not (REPO / "tasks" / "methods" / m / f).is_file()] for m in NAMES}
    assert not {m: f for m, f in missing.items() if f}, f"method folders missing files: {missing}"
    wrong = {m: METHODS[m].params.__module__ for m in NAMES
             if METHODS[m].params.__module__ != f"tasks.methods.{m}.params"}
    assert not wrong, f"method params defined outside tasks/methods/<m>/params.py: {wrong}"
    for cls, spec in STAGES.items():
        if spec.fn.__module__.startswith("tasks.methods."):
            m = spec.fn.__module__.split(".")[2]
            assert spec.fn.__module__ == f"tasks.methods.{m}.stages", f"stage {spec.name} outside {m}/stages.py"
            assert cls.__module__ == f"tasks.methods.{m}.params", f"{cls.__name__} outside {m}/params.py"


def config_handed_to_tasks(source: str) -> list[str]:
    """Calls in a flow module that hand a ``tasks`` function or class the whole config (a bare ``cfg``, ``config``
    or ``conf`` argument); a ``*_params`` projection (what ``Params.of(cfg)`` is for one stage) may read it."""
    tree = ast.parse(source)
    imported = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0
                and (n.module or "").split(".")[0] == "tasks" for a in n.names}
    found = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        name = f.id if isinstance(f, ast.Name) else f.value.id if (
            isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.attr != "of") else None
        if name not in imported or (isinstance(f, ast.Name) and name.endswith(PROJECTIONS)):
            continue
        if any(isinstance(a, ast.Name) and a.id in {"cfg", "config", "conf"} for a in [*n.args, *(k.value for k in n.keywords)]):
            found.append(f"line {n.lineno}: {ast.unparse(n.func)}")
    return found


def test_no_flow_hands_tasks_the_whole_config():
    """A flow projects the config once (``Params.of(cfg)``, a group's params such as ``cfg.llm``); no ``tasks``
    function or class receives the whole ``cfg``."""
    bad = {str(p.relative_to(REPO)): hits for p in sorted((REPO / "flows").rglob("*.py"))
           if (hits := config_handed_to_tasks(p.read_text()))}
    assert not bad, f"the whole config handed to tasks/: {bad}"


def test_the_config_check_finds_a_whole_config_argument():
    assert config_handed_to_tasks("from tasks.methods.erarag.retriever import EraRetriever\n"
                                  "def retriever(data, index, cfg):\n    return EraRetriever(data, index, cfg)\n"
                                  ) == ["line 3: EraRetriever"]
    assert config_handed_to_tasks("from tasks.methods import x\nx.run(config)\n") == ["line 2: x.run"]
    assert not config_handed_to_tasks("from tasks.text.chunk import ChunkParams, chunk\n"
                                      "def index(ctx, cfg, d):\n    return chunk(ctx, ChunkParams.of(cfg), d)\n")
    assert not config_handed_to_tasks("from tasks.llm.ner_backends import ner_params\nner_params(cfg, 'doc_id')\n")
