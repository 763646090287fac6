"""Load a spaCy pipeline that needs no torch without importing torch.

thinc, which spaCy runs on, imports torch when it is installed (``thinc/compat.py``), whatever the pipeline:
1.4 s of every process that loads ``en_core_web_sm`` here (2.5 → 1.1 s for import and load, three runs each),
for a pipeline that never calls torch. :func:`skip_torch_in_thinc` makes thinc's import of torch fail as if
torch were not installed, for that one module, while it loads, and only while torch is not loaded yet;
torch itself stays importable for everything else (sentence-transformers, a later ``import torch``, another
thread).

It is switched on by the command (``flows.runtime.pipeline.run_command``) only for a pipeline whose config names no
torch-backed layer (:func:`pipeline_needs_torch`): a transformer pipeline (``en_core_web_trf``) keeps thinc's
torch. The entities are the same either way (``tests/tasks/text/test_spacy_without_torch.py`` runs both on
the same texts), so no stored row depends on it.
"""
from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

THINC_COMPAT = "thinc.compat"  # thinc's one module that imports torch when it loads
# what a pipeline's config.cfg names when a layer runs on torch (spacy-transformers, curated transformers,
# thinc's PyTorchWrapper)
TORCH_LAYER = re.compile(r"torch|transformer", re.IGNORECASE)


def pipeline_needs_torch(model: str) -> bool:
    """Whether the installed spaCy pipeline package ``model`` may run a torch layer: its ``config.cfg``
    names one, or the package or its config cannot be found (then nothing is assumed). spaCy is not imported."""
    try:
        spec = importlib.util.find_spec(model)
    except (ImportError, ValueError):
        return True
    if spec is None or not spec.submodule_search_locations:
        return True
    configs = [c for root in spec.submodule_search_locations for pattern in ("config.cfg", "*/config.cfg")
               for c in Path(root).glob(pattern)]
    return not configs or any(TORCH_LAYER.search(c.read_text(encoding="utf-8", errors="replace")) for c in configs)


class _WithoutTorch(importlib.abc.Loader):
    """Runs a module's code with an ``__import__`` of its own that fails for torch while the code runs, as
    if torch were not installed. Only that module sees it: no other thread's import is touched."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        loading = True
        real_import = builtins.__import__

        def guarded_import(name: str, globals: dict | None = None, locals: dict | None = None,
                           fromlist: tuple = (), level: int = 0) -> ModuleType:
            if loading and level == 0 and name.split(".")[0] == "torch" and "torch" not in sys.modules:
                raise ImportError(f"{name} is not imported while thinc loads (tasks.text.spacy_without_torch)")
            return real_import(name, globals, locals, fromlist, level)

        # the module's functions keep these builtins; after loading, their imports go through unchanged
        module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": guarded_import}
        try:
            self.inner.exec_module(module)
        finally:
            loading = False


class _ThincWithoutTorch(importlib.abc.MetaPathFinder):
    """Finds ``thinc.compat`` where the standard path finder does, and wraps its loader in
    :class:`_WithoutTorch`."""

    def find_spec(self, name: str, path: object = None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if name != THINC_COMPAT:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None and "torch" not in sys.modules:
            spec.loader = _WithoutTorch(spec.loader)
        return spec


def skip_torch_in_thinc() -> bool:
    """Install the finder (once); True if thinc will load without torch, False if it is loaded already."""
    if THINC_COMPAT in sys.modules:
        return False
    if not any(isinstance(f, _ThincWithoutTorch) for f in sys.meta_path):
        sys.meta_path.insert(0, _ThincWithoutTorch())
    return True
