"""Tests for tasks/core/code_identity.py: a stage's hash follows the code it runs, and nothing else.

Each version of a small package is imported in its own process (so an edited file is a fresh
import, as it is for a user who edits and re-runs), and the stage's hash is compared across versions.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import FunctionType

import pytest

from tasks.core.code_identity import MACHINERY, CodeChangedError, code_closure, code_version

REPO = Path(__file__).resolve().parents[3]

HELPERS = '''
import re

SCALE = 2.0
_WORD = re.compile(r"\\w+")


def inner(x):
    return x * SCALE


def helper(x):
    """Calls inner."""
    return inner(x) + 1


def unrelated(x):
    return x - 1
'''

STAGES = '''
from idpkg import helpers
from idpkg.helpers import helper


def stage(x):
    """The stage: helper directly, helpers.inner through the module."""
    return helper(x) + helpers.inner(x)


def other_stage(x):
    return x


def lazy_stage(x):
    from idpkg import late

    return late.compute(x)
'''

LATE = '''
def compute(x):
    return x + 3
'''


def _hash(tmp_path: Path, name: str, helpers: str = HELPERS, stages: str = STAGES, late: str = LATE,
          entry: str = "stage") -> str:
    """code_version(idpkg.stages.<entry>) of one version of the package, computed in a fresh process."""
    root = tmp_path / name
    (root / "idpkg").mkdir(parents=True)
    (root / "idpkg" / "__init__.py").write_text("")
    (root / "idpkg" / "helpers.py").write_text(textwrap.dedent(helpers))
    (root / "idpkg" / "stages.py").write_text(textwrap.dedent(stages))
    (root / "idpkg" / "late.py").write_text(textwrap.dedent(late))
    old = time.time() - 3600  # written before the process starts, as source files are
    for f in (root / "idpkg").glob("*.py"):
        os.utime(f, (old, old))
    script = ("import sys; sys.path.insert(0, sys.argv[1]); from tasks.core.code_identity import code_version; "
              f"import idpkg.stages as s; print(code_version(s.{entry}, packages=('idpkg',)))")
    out = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_unrelated_edits_leave_the_stage_hash_unchanged(tmp_path):
    base = _hash(tmp_path, "base")
    assert len(base) == 16
    assert _hash(tmp_path, "again") == base
    edited = HELPERS.replace("return x - 1", "return x - 100")  # a function the stage never calls
    assert _hash(tmp_path, "unrelated", helpers=edited) == base
    cosmetic = HELPERS.replace('"""Calls inner."""', '"""Calls inner, documented at length."""')
    cosmetic = cosmetic.replace("def inner(x):\n", "# a comment\n\ndef inner(x):\n\n")
    assert _hash(tmp_path, "cosmetic", helpers=cosmetic) == base
    other = STAGES.replace("def other_stage(x):\n    return x", "def other_stage(x):\n    return -x")
    assert _hash(tmp_path, "other-stage", stages=other) == base


def test_edits_to_called_code_change_the_stage_hash(tmp_path):
    base = _hash(tmp_path, "base")
    direct = HELPERS.replace("return inner(x) + 1", "return inner(x) + 2")
    through_helper = HELPERS.replace("return x * SCALE", "return x * SCALE * 1")
    constant = HELPERS.replace("SCALE = 2.0", "SCALE = 3.0")
    own = STAGES.replace("return helper(x) + helpers.inner(x)", "return helper(x) - helpers.inner(x)")
    hashes = [_hash(tmp_path, "direct", helpers=direct), _hash(tmp_path, "through", helpers=through_helper),
              _hash(tmp_path, "constant", helpers=constant), _hash(tmp_path, "own", stages=own)]
    assert base not in hashes and len(set(hashes)) == 4


def test_a_function_local_import_is_followed(tmp_path):
    base = _hash(tmp_path, "base", entry="lazy_stage")
    assert _hash(tmp_path, "late", late=LATE.replace("x + 3", "x + 4"), entry="lazy_stage") != base
    assert _hash(tmp_path, "helpers", helpers=HELPERS.replace("x * SCALE", "x * 5"), entry="lazy_stage") == base


PARAMS = '''
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Params:
    alpha: float = 0.5
    steps: int = 3
    ks: tuple = field(default_factory=tuple)


def stage(x, p=Params()):
    return x * p.alpha
'''


def test_field_metadata_is_not_part_of_a_stage_hash(tmp_path):
    """Limits live on the fields as metadata; adding or changing them rebuilds nothing, a default still does."""
    base = _hash(tmp_path, "base", stages=PARAMS)
    limited = PARAMS.replace("alpha: float = 0.5", 'alpha: float = field(default=0.5, metadata={"limit": "[0, 1]"})')
    limited = limited.replace("steps: int = 3", 'steps: int = field(metadata={"limit": "[1, inf)"}, default=3)')
    limited = limited.replace("field(default_factory=tuple)", 'field(default_factory=tuple, metadata={"x": 1})')
    assert _hash(tmp_path, "limited", stages=limited) == base
    other_limit = limited.replace('"[0, 1]"', '"[0, 2]"')
    assert _hash(tmp_path, "other-limit", stages=other_limit) == base
    assert _hash(tmp_path, "default", stages=limited.replace("default=0.5", "default=0.7")) != base
    assert _hash(tmp_path, "factory", stages=PARAMS.replace("default_factory=tuple", "default_factory=list")) != base


def test_real_stages_reach_their_algorithms_and_not_their_neighbours():
    from tasks.methods.zoomrag.stages import doc_doc_graph, global_block
    from tasks.text.chunk import chunk
    from tasks.text.embed import embed

    doc_doc = code_closure(doc_doc_graph)
    assert "tasks.methods.zoomrag.stages.doc_doc_graph" in doc_doc
    assert any(name.endswith(".doc_doc_block") for name in doc_doc)  # the algorithm, through the module
    assert not any(name.endswith("global_block") for name in doc_doc)  # its neighbour in the same module
    assert code_version(doc_doc_graph) != code_version(global_block)
    assert any(n.endswith("._NOT_AN_END") for n in code_closure(chunk))  # a regex constant of the splitter
    machinery = tuple(f"{m}." for m in MACHINERY)  # the store's modules: embed calls its codec and hashes
    assert not any(n.startswith(machinery) for n in code_closure(embed))  # machinery is not hashed


def test_modules_are_refused():
    import tasks.text.chunk as chunk_module

    with pytest.raises(TypeError, match="not the module"):
        code_version(chunk_module)


def test_a_source_file_edited_after_import_is_refused(tmp_path, monkeypatch):
    import importlib

    import tasks.core.code_identity as ci

    (tmp_path / "algo_mod.py").write_text("import functools\n\n\n@functools.lru_cache\ndef f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("algo_mod")
    before = ci._LOADED_AT - 60  # written before this process imported its code
    os.utime(tmp_path / "algo_mod.py", (before, before))
    assert len(code_version(mod.f)) == 16  # unchanged since import: fine
    later = time.time() + 60  # edited while the run is in progress
    os.utime(tmp_path / "algo_mod.py", (later, later))
    with pytest.raises(CodeChangedError, match="changed on disk"):
        code_version(mod.f)


def test_the_hash_is_the_same_in_every_process():
    """Sets and frozensets (e.g. NER's numeric labels) must not hash in string-hash order."""
    script = "from tasks.core.code_identity import code_version; from tasks.llm.ner_backends import ner; print(code_version(ner))"
    out = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONHASHSEED": seed}) for seed in ("1", "2")]
    assert all(o.returncode == 0 for o in out), [o.stderr for o in out]
    assert out[0].stdout.strip() == out[1].stdout.strip() != ""


def test_code_compiled_from_no_file_gets_a_version_not_an_error() -> None:
    """A runner may load a flow module from source text ("<dynamic-code>", Prefect's deployment runs): its
    functions have no file to check or read, and still get a stable digest that follows their code."""
    from tasks.core.code_identity import _digest

    def compiled(body: str):
        ns: dict = {}
        exec(compile(f"def f(x):\n    return {body}\n", "<dynamic-code>", "exec"), ns)
        return ns["f"]

    assert _digest(compiled("x + 1")) == _digest(compiled("x + 1"))
    assert _digest(compiled("x + 1")) != _digest(compiled("x + 2"))


CLASSES = '''
import dataclasses


class Outer:
    """Docstring."""

    class Inner:
        x = 1


@dataclasses.dataclass
class Decorated:
    y: int = 2


def factory():
    class Local:
        z = 3

    return Local


if True:
    class Twice:
        first = True
else:
    class Twice:
        first = False
'''


def test_class_sources_are_what_inspect_finds_nested_decorated_local_and_repeated(tmp_path, monkeypatch):
    """Classes are found with one parse per file; the text must be inspect.getsource's, or stored versions move."""
    import importlib
    import inspect

    import tasks.core.code_identity as ci

    (tmp_path / "classes_mod.py").write_text(CLASSES)
    before = ci._LOADED_AT - 60
    os.utime(tmp_path / "classes_mod.py", (before, before))
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("classes_mod")
    for cls in (mod.Outer, mod.Outer.Inner, mod.Decorated, mod.factory(), mod.Twice):
        assert ci._source(cls) == inspect.getsource(cls), cls.__qualname__
    assert ci._source(mod.Decorated).startswith("@dataclasses.dataclass")
    assert "first = True" in ci._source(mod.Twice)  # the first definition, as inspect's finder returns


def test_every_project_function_and_class_reads_the_source_inspect_reads():
    """The per-process source cache and the class finder give, for all project code, inspect.getsource's text."""
    import importlib
    import inspect
    import pkgutil

    import tasks
    import tasks.core.code_identity as ci

    objects: list = []
    seen: set[int] = set()
    for info in pkgutil.walk_packages(tasks.__path__, "tasks."):
        module = importlib.import_module(info.name)
        todo = [v for v in vars(module).values() if getattr(v, "__module__", None) == module.__name__]
        while todo:
            obj = todo.pop()
            obj = getattr(obj, "__func__", obj)
            if not isinstance(obj, (type, FunctionType)) or id(obj) in seen:
                continue
            seen.add(id(obj))
            objects.append(obj)
            if isinstance(obj, type):
                todo += [v for v in vars(obj).values() if getattr(getattr(v, "__func__", v), "__module__", None)
                         == module.__name__]
    classes = [o for o in objects if isinstance(o, type)]
    assert len(objects) > 500 and len(classes) > 50
    for obj in objects:
        try:
            expected = inspect.getsource(obj)
        except (OSError, TypeError):
            expected = None
        assert ci._source(obj) == expected, obj.__qualname__
