"""Serving a built index: the Python API (:func:`open_index`), ``dagrag query`` and ``dagrag serve``."""
from flows.serving.index import Answer, Index, IndexNotBuilt, Passage, Ranked, open_index

__all__ = ["Answer", "Index", "IndexNotBuilt", "Passage", "Ranked", "open_index"]
