"""A stage's code identity: a hash of exactly the project code it runs.

:func:`code_version` starts from a stage's entry points (its task function, or the functions that
compute one row of a per-row stage) and follows, transitively, every project function, class and
constant their code names: globals, attributes of project modules (``zoom.doc_doc_block``),
function-local imports (``from tasks.llm import ner``), default arguments and closures. Each one
contributes the AST of its own source with docstrings removed, so

* an edit to a function the stage calls, directly or through any helper, changes the hash;
* an edit to an unrelated function in the same module, a comment, a docstring or a blank line
  does not (a 240-second doc-doc rebuild is not paid for a comment);
* a module-level constant (a regex, a stage name, a number, a set or dict of such) contributes its
  value, written the same way in every process (sets sorted, not in string-hash order). Runtime
  state therefore must not live in module-level containers (use ``functools.lru_cache``).

Not followed (a stated limit, not an accident): a method reached only through a value passed in
(``params.chunking()`` on an argument); a class named in the code is hashed whole, methods
included. Third-party code is represented by the package versions in each run's manifest. The
machinery modules (:data:`MACHINERY`) decide where results are stored or how progress is shown,
not what results are, and are not hashed. Stdlib only, so it is cheap to import.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import inspect
import linecache
import os
import threading
import re
import sys
import textwrap
import time
from types import CodeType, FunctionType, MethodType, ModuleType
from typing import Any, Callable, Iterator

PROJECT_PACKAGES = ("tasks",)
# the stage runner, the store (its catalog, files, locks, row caches, vector codec, hashes and memory gauges) and
# this module: where results live, not what they are; progress: how work is shown
MACHINERY = frozenset({"tasks.core.store", "tasks.core.catalog", "tasks.core.files", "tasks.core.locks",
                       "tasks.core.row_cache", "tasks.core.vectors", "tasks.core.hashing", "tasks.core.memory",
                       "tasks.core.stage", "tasks.core.code_identity", "tasks.core.progress"})
_LITERALS = (str, bytes, int, float, complex, bool, type(None), tuple, frozenset)
_LOADED_AT = time.time()  # source files hashed below must not have changed since the code was imported


class CodeChangedError(RuntimeError):
    """A source file changed on disk after this process imported it: its hash cannot be trusted."""


def code_version(*entry_points: Callable | type, packages: tuple[str, ...] = PROJECT_PACKAGES) -> str:
    """16-hex hash of the code the entry points run, followed transitively through project code.

    The closure's members are hashed by their qualified name and docstring-free AST, so the hash
    does not depend on the order in which they were reached, only on the entry points' order.
    """
    closure = code_closure(*entry_points, packages=packages)
    roots = [_name(_unwrap(e)) for e in entry_points]
    h = hashlib.sha256(repr(roots).encode())
    for name in sorted(closure):
        h.update(f"{name}\x1f{closure[name]}\x1e".encode())
    return h.hexdigest()[:16]


def code_closure(*entry_points: Callable | type, packages: tuple[str, ...] = PROJECT_PACKAGES) -> dict[str, str]:
    """``{qualified name: digest}`` of every project object the entry points reach (for inspection and tests)."""
    seen: dict[str, str] = {}
    stack = [_unwrap(e) for e in entry_points]
    for obj in stack:
        if isinstance(obj, ModuleType):
            raise TypeError(f"code_version takes functions or classes, not the module {obj.__name__}: "
                            "hashing a whole module rebuilds a stage for any edit in it")
    while stack:
        obj = stack.pop()
        name = _name(obj)
        if name in seen:
            continue
        seen[name] = _digest(obj)
        stack.extend(_references(obj, packages))
    return seen


# ----------------------------------------------------------------------------- what an object is


def _unwrap(obj: Any) -> Any:
    """The plain function behind a Prefect task, a bound method, a staticmethod or a functools wrapper."""
    obj = getattr(obj, "fn", obj)  # prefect.Task
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, MethodType):
        obj = obj.__func__
    return inspect.unwrap(obj) if callable(obj) else obj


def _name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def _is_project(obj: Any, packages: tuple[str, ...]) -> bool:
    module = obj.__name__ if isinstance(obj, ModuleType) else getattr(obj, "__module__", None)
    return isinstance(module, str) and _is_project_module_name(module, packages)


# CPython 3.11's AST constructor keeps its recursion depth in interpreter-wide state, so two threads
# parsing at once can fail with "SystemError: AST constructor recursion depth mismatch" (cpython
# gh-106905); the thread runner hashes concurrent stages, so parsing is serialised: ours, and
# inspect.getsource's (it parses the module to find a class).
_AST_LOCK = threading.RLock()


@functools.lru_cache(maxsize=None)
def _source_digest(path: str, qualname: str, source: str) -> str:
    """sha256 of the docstring-free AST of one function's or class's source."""
    try:
        with _AST_LOCK:
            tree = ast.parse(textwrap.dedent(source))
    except SyntaxError:  # e.g. a lambda cut out of a longer line: fall back to the raw text
        return hashlib.sha256(source.encode()).hexdigest()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign):
                    statement.value = _without_metadata(statement.value)
    return hashlib.sha256(ast.dump(tree, annotate_fields=False, include_attributes=False).encode()).hexdigest()


def _without_metadata(value: ast.expr | None) -> ast.expr | None:
    """A dataclass field's value as its stage sees it: ``field(default=X, metadata=...)`` → ``X``.

    A field's metadata (the limits the config check reads, :mod:`tasks.core.limits`) says what a user may
    set, not what the stage computes, so adding or changing it rebuilds nothing.
    """
    if not (isinstance(value, ast.Call) and not value.args
            and (getattr(value.func, "id", None) == "field" or getattr(value.func, "attr", None) == "field")):
        return value
    keywords = [k for k in value.keywords if k.arg != "metadata"]
    if not keywords:
        return None
    if len(keywords) == 1 and keywords[0].arg == "default":
        return keywords[0].value
    return ast.Call(value.func, [], keywords)


def _digest(obj: Any) -> str:
    if isinstance(obj, (FunctionType, type)):
        path = inspect.getsourcefile(obj)
        if path and os.path.isfile(path) and os.path.getmtime(path) > _LOADED_AT:
            raise CodeChangedError(f"{path} changed on disk after this process imported it; its code version "
                                   "cannot be trusted. Re-run the command so it loads the current code.")
        source = _source(obj)
        if source is None:  # compiled from no file (a runner's "<dynamic-code>"): hash what it runs
            code = getattr(obj, "__code__", None)
            return hashlib.sha256(repr((obj.__qualname__, code.co_code if code else None,
                                        code.co_consts if code else None)).encode()).hexdigest()
        return _source_digest(path or "?", obj.__qualname__, source)
    return hashlib.sha256(_literal(obj).encode()).hexdigest()


# One function's or class's source, read once per process: the code a process runs does not change under it
# (a file edited since import is refused above), and a command, a sweep or a test session asks for the same
# helpers' versions once per stage and run. {id: (object, source or None)}; the object keeps its id taken.
_SOURCES: dict[int, tuple[Any, str | None]] = {}


def _source(obj: FunctionType | type) -> str | None:
    """``inspect.getsource(obj)``, or None where there is no source; classes found with one parse per file."""
    hit = _SOURCES.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    try:
        with _AST_LOCK:
            source = _class_source(obj) if isinstance(obj, type) else inspect.getsource(obj)
    except (OSError, TypeError):
        source = None
    _SOURCES[id(obj)] = (obj, source)
    return source


def _class_source(cls: type) -> str:
    """What ``inspect.getsource(cls)`` returns, without parsing the whole module again for every class.

    CPython 3.11 finds a class by parsing its entire file (``inspect._ClassFinder``) on every call; here the
    file is parsed once and every class's first line (its first decorator's, as there) is looked up by qualname.
    """
    path = inspect.getsourcefile(cls)
    if not path:
        raise OSError(f"no source file for {cls.__qualname__}")
    linecache.checkcache(path)
    module = sys.modules.get(cls.__module__)
    lines = linecache.getlines(path, module.__dict__ if module else None)
    if not lines:
        raise OSError(f"cannot read {path}")
    start = _class_lines("".join(lines)).get(cls.__qualname__)
    if start is None:
        raise OSError(f"could not find class definition {cls.__qualname__} in {path}")
    return "".join(inspect.getblock(lines[start:]))


@functools.lru_cache(maxsize=256)
def _class_lines(text: str) -> dict[str, int]:
    """``{qualname: 0-based first line}`` of every class in one file (the first definition of each name wins)."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, (*scope, child.name, "<locals>"))
            elif isinstance(child, ast.ClassDef):
                qualname = ".".join((*scope, child.name))
                first = child.decorator_list[0].lineno if child.decorator_list else child.lineno
                found.setdefault(qualname, first - 1)
                visit(child, (*scope, child.name))
            else:
                visit(child, scope)

    visit(ast.parse(text), ())
    return found


def _literal(value: Any) -> str:
    """A text of a constant that is the same in every process (a compiled regex by its pattern and flags)."""
    if isinstance(value, re.Pattern):
        return f"re({value.pattern!r}, {value.flags})"
    if isinstance(value, (set, frozenset)):  # their repr's order follows string hashing, which differs per process
        return "{" + ", ".join(sorted(map(_literal, value))) + "}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(map(_literal, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


# ----------------------------------------------------------------------------- what an object names


def _code_objects(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _code_objects(const)


def _references(obj: Any, packages: tuple[str, ...]) -> list[Any]:
    """Project functions, classes and constants that ``obj``'s code names."""
    if isinstance(obj, type):
        members = [_unwrap(v) for v in vars(obj).values() if isinstance(v, (FunctionType, staticmethod, classmethod))]
        bases = [b for b in obj.__bases__ if _is_project(b, packages)]
        # methods a decorator generated (a dataclass's __init__) have no source: the class's own source decides them
        return [m for m in members if isinstance(m, FunctionType) and _has_source(m)] + bases
    if not isinstance(obj, FunctionType):
        return []
    names = {n for code in _code_objects(obj.__code__) for n in code.co_names}
    scope = obj.__globals__
    modules = [m for m in (scope.get(n) for n in names) if isinstance(m, ModuleType) and _is_project(m, packages)]
    modules += [m for m in map(_project_module, (n for n in names if n.split(".")[0] in packages)) if m is not None and _is_project(m, packages)]
    found: list[Any] = []
    for mod in modules:  # attributes of project modules, including submodules reached through them
        for n in names:
            value = getattr(mod, n, None)
            if value is None and hasattr(mod, "__path__"):  # a submodule named by a local `from pkg import mod`
                value = _project_module(f"{mod.__name__}.{n}")
            if isinstance(value, ModuleType) and _is_project(value, packages) and value not in modules:
                modules.append(value)
            elif value is not None:
                found.append((mod.__name__, n, value))
    found += [(obj.__module__, n, scope[n]) for n in names if n in scope and not n.startswith("__")]
    extras = list(obj.__defaults__ or ()) + list((obj.__kwdefaults__ or {}).values())
    extras += [c.cell_contents for c in (obj.__closure__ or ()) if _has_contents(c)]
    found += [(obj.__module__, None, v) for v in extras]
    out: list[Any] = []
    for module, attr, value in found:
        value = _unwrap(value)
        if isinstance(value, (FunctionType, type)) and _is_project(value, packages):
            out.append(value)
        elif attr is not None and _is_project_module_name(module, packages) and _is_constant(value):
            out.append(_Constant(f"{module}.{attr}", value))
        elif _is_project(type(value), packages):  # an instance (a default params object): its class
            out.append(type(value))
    return out


def _project_module(name: str) -> ModuleType | None:
    """The module of that dotted name, imported if it exists and is not yet (a function-local import)."""
    if name in sys.modules:
        return sys.modules[name]
    try:
        return importlib.import_module(name) if importlib.util.find_spec(name) is not None else None
    except (ImportError, ValueError):
        return None


def _is_project_module_name(module: str, packages: tuple[str, ...]) -> bool:
    return module.split(".")[0] in packages and module not in MACHINERY


def _is_constant(value: Any) -> bool:
    if isinstance(value, re.Pattern):
        return True
    if isinstance(value, (tuple, frozenset, list, set)):
        return all(_is_constant(v) for v in value)
    if isinstance(value, dict):
        return all(_is_constant(k) and _is_constant(v) for k, v in value.items())
    return isinstance(value, _LITERALS)


def _has_source(fn: FunctionType) -> bool:
    try:
        path = inspect.getsourcefile(fn)
    except TypeError:
        return False
    return not path or _source(fn) is not None


def _has_contents(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


class _Constant:
    """A module-level constant reached from project code: named by where it lives, hashed by value."""

    def __init__(self, qualified: str, value: Any) -> None:
        self.__module__, _, self.__qualname__ = qualified.rpartition(".")
        self.value = value

    def __repr__(self) -> str:
        return _literal(self.value)
