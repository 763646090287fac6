"""A LangChain retriever over a dagrag index: ``pip install -e '.[langchain]'``.

>>> from flows.integrations.langchain import DagragRetriever
>>> retriever = DagragRetriever.of(open_index("method=bm25", "dataset=sample"), k=5)   # or remote(url, key)
>>> retriever.invoke("Who founded the Vell Guild?")          # [Document(page_content=..., metadata={...}), ...]

Each :class:`~langchain_core.documents.Document` is one ranked passage: ``page_content`` its text, ``id`` its doc id,
and in ``metadata`` its score and rank, every other field of :meth:`Passage.to_dict` (doc id, title, lineage) and
the method's trace for the question. ``ainvoke``/``abatch`` use the server's micro-batching
(:mod:`flows.integrations.source`). Beyond the papers: integrations.
"""
from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from flows.integrations.source import Source, metadata
from flows.serving.index import Index, Ranked
from flows.serving.remote import Remote


def documents(ranked: Ranked) -> list[Document]:
    """A question's ranked passages as LangChain documents, best first."""
    return [Document(page_content=p.text, id=p.doc_id, metadata=metadata(p, ranked, ("text",))) for p in ranked]


class DagragRetriever(BaseRetriever):
    """LangChain's ``BaseRetriever`` over an opened or a served dagrag index (build it with :meth:`of`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    source: Source

    @classmethod
    def of(cls, index: Index | Remote, k: int | None = None, **kwargs: Any) -> "DagragRetriever":
        """A retriever over ``index`` (``open_index(...)`` or ``remote(url, key)``), ``k`` passages per question
        (None: the method's ``top_k``)."""
        return cls(source=Source(index, k), **kwargs)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return documents(self.source.retrieve([query])[0])

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        return documents((await self.source.aretrieve([query]))[0])
