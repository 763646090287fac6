"""The LangChain and LlamaIndex retrievers, in process and over a real server: each library's own documents,
equal to ``open_index().retrieve``, inside a real LCEL chain and a real LlamaIndex query engine with the
library's own fake LLM; async calls share the server's micro-batching."""
from __future__ import annotations

import asyncio

import pytest

from flows.runtime.config import ServeParams
from flows.serving import open_index, remote
from flows.serving.app import Service
from tests.flows.serving_helpers import build_bm25, sample_questions, uvicorn_thread

langchain_core = pytest.importorskip("langchain_core", reason="pip install -e '.[langchain]'")
llama_index = pytest.importorskip("llama_index.core", reason="pip install -e '.[llamaindex]'")

K = 4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(the opened index, a remote client of a real server over it, the sample's questions)."""
    overrides = build_bm25(tmp_path_factory.mktemp("integrations"))
    index = open_index(*overrides)
    with uvicorn_thread(Service(index, ServeParams(), api_key="integrations-key")) as url:
        yield index, remote(url, api_key="integrations-key"), sample_questions(overrides)


def test_langchain_documents_equal_open_index_in_process_and_remote(setup):
    from flows.integrations.langchain import DagragRetriever

    index, client, questions = setup
    expected = index.retrieve(questions, k=K)
    for target in (index, client):
        retriever = DagragRetriever.of(target, k=K)
        for got in (retriever.batch(questions), asyncio.run(retriever.abatch(questions))):
            for docs, ranked in zip(got, expected):
                assert [d.page_content for d in docs] == [p.text for p in ranked]
                assert [d.id for d in docs] == [p.doc_id for p in ranked]
                for d, p in zip(docs, ranked):
                    want = {k: v for k, v in p.to_dict().items() if k != "text"}
                    assert d.metadata == {**want, "trace": ranked.trace}


def test_langchain_retriever_inside_an_lcel_chain(setup):
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough

    from flows.integrations.langchain import DagragRetriever

    index, client, questions = setup
    prompts = []
    prompt = ChatPromptTemplate.from_messages([("system", "Answer from these passages:\n{context}"),
                                               ("human", "{question}")])
    for target in (index, client):
        prompts.clear()
        retriever = DagragRetriever.of(target, k=K)
        chain = ({"context": retriever | RunnableLambda(lambda docs: "\n\n".join(d.page_content for d in docs)),
                  "question": RunnablePassthrough()}
                 | prompt | RunnableLambda(lambda p: prompts.append(p) or p)
                 | FakeListChatModel(responses=["the fake answer"]) | StrOutputParser())
        assert chain.invoke(questions[0]) == "the fake answer"
        assert asyncio.run(chain.ainvoke(questions[1])) == "the fake answer"
        for q, seen in zip(questions[:2], prompts):
            system, human = seen.to_messages()
            assert human.content == q
            assert system.content == "Answer from these passages:\n" + "\n\n".join(
                p.text for p in index.retrieve(q, k=K)[0])


def test_llamaindex_nodes_equal_open_index_and_feed_a_query_engine(setup):
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine

    from flows.integrations.llamaindex import DagragRetriever

    index, client, questions = setup
    expected = index.retrieve(questions, k=K)
    for target in (index, client):
        retriever = DagragRetriever(target, k=K)
        got = [retriever.retrieve(q) for q in questions]
        got_async = asyncio.run(_gather(retriever.aretrieve, questions))
        for nodes, ranked in zip(got, expected):
            assert [n.node.node_id for n in nodes] == [p.doc_id for p in ranked]
            assert [n.node.get_content() for n in nodes] == [p.text for p in ranked]
            assert [n.score for n in nodes] == [p.score for p in ranked]
            for n, p in zip(nodes, ranked):
                want = {k: v for k, v in p.to_dict().items() if k not in ("text", "score")}
                assert n.node.metadata == {**want, "trace": ranked.trace}
        assert [[n.node.node_id for n in nodes] for nodes in got_async] == [[n.node.node_id for n in nodes]
                                                                            for nodes in got]
        # a real query engine: the retriever's nodes, with MockLLM (which echoes its prompt) as the LLM
        engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
        response = engine.query(questions[0])
        assert [n.node.node_id for n in response.source_nodes] == [p.doc_id for p in expected[0]]
        shown = str(response)
        places = [shown.index(p.text) for p in expected[0]]
        assert places == sorted(places) and questions[0] in shown  # every passage, in rank order


async def _gather(call, questions):
    return await asyncio.gather(*(call(q) for q in questions))


def test_async_calls_in_process_share_one_batched_search(setup):
    """Concurrent ``ainvoke`` calls on one event loop are searched together, by serve's micro-batcher."""
    from flows.integrations.langchain import DagragRetriever

    index, _, questions = setup
    retriever = DagragRetriever.of(index, k=K)
    got = asyncio.run(_gather(retriever.ainvoke, questions))
    assert [[d.id for d in docs] for docs in got] == [[p.doc_id for p in r] for r in index.retrieve(questions, k=K)]
    assert max(retriever.source.batch_sizes) > 1 and sum(retriever.source.batch_sizes) == len(questions)


def test_a_retriever_refuses_what_is_not_an_index():
    from flows.integrations.langchain import DagragRetriever

    with pytest.raises(TypeError, match="open_index"):
        DagragRetriever.of("http://127.0.0.1:8000")
