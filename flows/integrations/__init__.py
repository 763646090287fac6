"""dagrag in the RAG ecosystem: LangChain and LlamaIndex retrievers (:mod:`.langchain`, :mod:`.llamaindex`, each an
optional extra) and the MCP server (:mod:`.mcp_server`, ``dagrag mcp``). Beyond the papers: integrations."""
