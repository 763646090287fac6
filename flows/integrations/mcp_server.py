"""An MCP server over one opened index (``dagrag mcp``), with the official ``mcp`` SDK: a ``retrieve`` tool
(question, k → passages with their citations), an ``answer`` tool when an LLM is configured, and the index's
description as the resource ``dagrag://index``. Beyond the papers: integrations.

Transports: stdio (an agent host starts ``dagrag mcp`` and speaks over its stdin/stdout) or streamable HTTP
(``serve.mcp_transport=http``, at ``serve.host``:``serve.port`` + ``serve.mcp_path``). Over HTTP the rules of
``dagrag serve`` apply: loopback by default, any other address only with ``DAGRAG_API_KEY``, and with a key every
request needs ``Authorization: Bearer <key>``.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from flows.integrations.source import Source
from flows.serving.index import Index, Ranked
from flows.serving import schema
from flows.serving.app import bearer_matches, has_llm

INDEX_URI = "dagrag://index"


class Cited(schema.Passage):
    """A ranked passage and the string to cite it by."""

    citation: str = Field(description="how to cite the passage: 'docs/guide.md § Install › Linux', "
                                      "'report.pdf p. 12', its title when it has no source file")


class Retrieved(BaseModel):
    question: str
    passages: list[Cited]
    trace: dict[str, Any] = Field(description="the method's own trace (seeds, kept chunks, communities, …)")


class Answered(Retrieved):
    answer: str


def cited(ranked: Ranked) -> list[Cited]:
    """A question's passages with their citations (every field of ``Passage.to_dict()`` kept)."""
    return [Cited(**p.to_dict(), citation=p.citation) for p in ranked]


def build_server(index: Index, max_k: int, max_question_chars: int) -> MCPServer:
    """The MCP server over ``index``; ``k`` and questions are bounded as ``serve.*`` bounds them over HTTP."""
    info = index.info
    server = MCPServer(name="dagrag", version="1",
                       instructions=f"Search the {info.method} index over {info.dataset} ({info.n_documents} "
                                    "passages): call retrieve with a question; cite passages by their citation.")
    source = Source(index)

    def checked(question: str, k: int | None) -> int:
        if not question.strip():
            raise ToolError("question is empty")
        if len(question) > max_question_chars:
            raise ToolError(f"question has {len(question)} characters; serve.max_question_chars={max_question_chars}")
        k = index.default_k if k is None else k
        if not 1 <= k <= max_k:
            raise ToolError(f"k must be between 1 and serve.max_k={max_k}, got {k}")
        return k

    @server.tool(description="Ranked passages for a question, best first, each with a citation. "
                             f"k: how many (1 to {max_k}; default the method's top_k={index.default_k}).")
    async def retrieve(question: str, k: int | None = None) -> Retrieved:
        k = checked(question, k)
        ranked = (await source.aretrieve([question], k))[0]
        return Retrieved(question=question, passages=cited(ranked), trace=ranked.trace)

    if has_llm(index):
        @server.tool(description="The configured LLM's answer to a question, from the passages retrieved for it "
                                 "(returned with their citations).")
        async def answer(question: str, k: int | None = None) -> Answered:
            k = checked(question, k)
            done = (await asyncio.to_thread(index.answer, [question], k))[0]
            return Answered(question=question, answer=done.answer, passages=cited(done.passages),
                            trace=done.passages.trace)

    @server.resource(INDEX_URI, name="index", mime_type="application/json",
                     description="The served index: method, dataset, settings, fingerprint, build time.")
    def describe() -> str:
        return json.dumps(info.to_dict())

    return server


class BearerKey:
    """ASGI middleware: with a key, every HTTP request needs ``Authorization: Bearer <key>`` (401 otherwise)."""

    def __init__(self, app: Any, key: str | None) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.key is not None:
            given = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), "")
            if not bearer_matches(given, self.key):
                from starlette.responses import JSONResponse

                response = JSONResponse({"error": "missing or wrong API key: send Authorization: Bearer <key>"}, 401,
                                        headers={"WWW-Authenticate": "Bearer"})
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def http_app(server: MCPServer, host: str, path: str, key: str | None) -> Any:
    """The streamable-HTTP ASGI app (the SDK's, with its DNS-rebinding guard on loopback), behind the key."""
    return BearerKey(server.streamable_http_app(streamable_http_path=path, host=host), key)
