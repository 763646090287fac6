"""A LlamaIndex retriever over a dagrag index: ``pip install -e '.[llamaindex]'``.

>>> from flows.integrations.llamaindex import DagragRetriever
>>> retriever = DagragRetriever(open_index("method=bm25", "dataset=sample"), k=5)     # or remote(url, key)
>>> retriever.retrieve("Who founded the Vell Guild?")        # [NodeWithScore(node=TextNode(...), score=...), ...]

Each :class:`~llama_index.core.schema.NodeWithScore` is one ranked passage: the node's text and id are the passage's
text and doc id, its score the method's score, and its metadata the rank, every other field of
:meth:`Passage.to_dict` (doc id, title, lineage) and the method's trace. Only the title goes into what the LLM or
an embedder reads of the metadata (LlamaIndex prepends metadata to a node's text). ``aretrieve`` uses the server's
micro-batching (:mod:`flows.integrations.source`). Beyond the papers: integrations.
"""
from __future__ import annotations

from typing import Any

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from flows.integrations.source import Source, metadata
from flows.serving.index import Index, Ranked
from flows.serving.remote import Remote


def nodes(ranked: Ranked) -> list[NodeWithScore]:
    """A question's ranked passages as LlamaIndex nodes with scores, best first."""
    out = []
    for p in ranked:
        meta = metadata(p, ranked, ("text", "score"))
        hidden = [key for key in meta if key != "title"]
        node = TextNode(id_=p.doc_id, text=p.text, metadata=meta, excluded_llm_metadata_keys=hidden,
                        excluded_embed_metadata_keys=hidden)
        out.append(NodeWithScore(node=node, score=p.score))
    return out


class DagragRetriever(BaseRetriever):
    """LlamaIndex's ``BaseRetriever`` over an opened or a served dagrag index, ``k`` passages per question
    (None: the method's ``top_k``)."""

    def __init__(self, index: Index | Remote, k: int | None = None, **kwargs: Any) -> None:
        self.source = Source(index, k)
        super().__init__(**kwargs)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return nodes(self.source.retrieve([query_bundle.query_str])[0])

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return nodes((await self.source.aretrieve([query_bundle.query_str]))[0])
