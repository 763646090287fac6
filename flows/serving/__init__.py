"""Serving a built index: the Python API (:func:`open_index`), a client for a served one (:func:`remote`),
``dagrag query``, ``dagrag serve`` and ``dagrag mcp``."""
from flows.serving.index import Answer, Index, IndexNotBuilt, Passage, Ranked, open_index
from flows.serving.remote import Remote, RemoteError, remote

__all__ = ["Answer", "Index", "IndexNotBuilt", "Passage", "Ranked", "Remote", "RemoteError", "open_index", "remote"]
