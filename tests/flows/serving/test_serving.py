"""Serving equals evaluating: for every method, an opened index (Python) and a real uvicorn server under
concurrent requests return exactly evaluate's stored hits (same doc ids, same order, scores to 1e-6)."""
from __future__ import annotations

import asyncio
import functools
import re
from pathlib import Path

import httpx
import pandas as pd
import pytest

from flows.runtime.config import ServeParams, load_config
from flows.methods import NAMES as METHOD_NAMES
from flows.commands.evaluate import evaluate_flow, retrieval_depth
from flows.serving.app import Service
from flows.serving.index import IndexNotBuilt, open_index
from tests.flows.conftest import make_config
from tests.flows.serving_helpers import uvicorn_thread

SAMPLE = ["dataset=sample", "dataset.n_passages=60", "dataset.n_questions=12"]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """Every method evaluated once on one small sample store: {method: (config, stored hits, questions)}."""
    root = tmp_path_factory.mktemp("serving")
    out = {}
    for method in METHOD_NAMES:
        cfg = make_config(root, f"method={method}", *SAMPLE)
        run_dir = root / f"run-{method}"
        evaluate_flow(cfg, str(run_dir))
        questions = pd.read_parquet(next(Path(cfg["artifacts_dir"]).glob("sample-*/ingest/questions-*.parquet")))
        out[method] = (cfg, pd.read_parquet(run_dir / "hits.parquet"), questions)
    return out


@functools.lru_cache(maxsize=None)
def _opened(method: str, artifacts_dir: str):
    return open_index(f"method={method}", *SAMPLE, f"artifacts_dir={artifacts_dir}")


def opened(built: dict, method: str):
    return _opened(method, built[method][0]["artifacts_dir"])


def assert_same(hits: pd.DataFrame, qid: str, passages: list[dict]) -> None:
    want = hits[hits["qid"] == qid].sort_values("rank")
    assert [p["doc_id"] for p in passages] == want["doc_id"].tolist(), qid
    assert [p["rank"] for p in passages] == want["rank"].tolist()
    for p, score in zip(passages, want["score"]):
        assert abs(p["score"] - score) <= 1e-6, (qid, p["doc_id"], p["score"], score)


def depth(cfg: dict) -> int:
    """As deep as evaluate ranked (recall@k, the method's top_k, answer_in_context's depth)."""
    return retrieval_depth(load_config(cfg))


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_open_index_equals_evaluate(built, method):
    cfg, hits, questions = built[method]
    index = opened(built, method)
    ranked = index.retrieve(questions["question"].tolist(), k=depth(cfg))
    assert len(ranked) == len(questions)
    for qid, r in zip(questions["qid"], ranked):
        assert_same(hits, qid, [p.to_dict() for p in r])
        assert all(p.title and p.text for p in r)
    assert index.info.method == method and re.fullmatch(r"[0-9a-f]{16}", index.info.fingerprint)


@pytest.mark.parametrize("method", METHOD_NAMES)
def test_served_equals_offline_under_concurrency(built, method):
    """Each question its own request, all at once: the batcher forms batches larger than one, and every answer
    is the stored one."""
    cfg, hits, questions = built[method]
    service = Service(opened(built, method), ServeParams(max_batch=64, max_wait_ms=50.0), api_key=None)
    k = depth(cfg)

    async def ask_all(url: str) -> list[dict]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            replies = await asyncio.gather(*(client.post("/retrieve", json={"question": q, "k": k})
                                             for q in questions["question"]))
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
        return [r.json() for r in replies]

    with uvicorn_thread(service) as url:
        replies = asyncio.run(ask_all(url))
        metrics = httpx.get(f"{url}/metrics").text
    for qid, reply in zip(questions["qid"], replies):
        assert_same(hits, qid, reply["results"][0])
        assert reply["index"]["fingerprint"] == service.index.info.fingerprint
    batches = float(re.search(r"^dagrag_batch_size_count (\S+)$", metrics, re.M).group(1))
    asked = float(re.search(r"^dagrag_batch_size_sum (\S+)$", metrics, re.M).group(1))
    assert asked == len(questions) and batches < asked  # some batch held several questions


def test_open_index_refuses_an_index_not_built(tmp_path, built):
    cfg = built["bm25"][0]
    with pytest.raises(IndexNotBuilt, match=r"dagrag index method=bm25 .*dataset.n_passages=61"):
        open_index("method=bm25", "dataset=sample", "dataset.n_passages=61", f"artifacts_dir={cfg['artifacts_dir']}")
    with pytest.raises(IndexNotBuilt, match="no index in"):
        open_index("method=bm25", *SAMPLE, f"artifacts_dir={tmp_path / 'nothing'}")
    assert not (tmp_path / "nothing").exists()  # opening writes nothing


def test_a_request_of_several_questions_equals_each_alone(built):
    cfg, hits, questions = built["zoomrag"]
    index = opened(built, "zoomrag")
    together = index.retrieve(questions["question"].tolist()[:5], k=5)
    for r in together:
        alone = index.retrieve([r.question], k=5)[0]
        assert [p.doc_id for p in alone] == [p.doc_id for p in r]
        assert all(abs(a.score - b.score) <= 1e-6 for a, b in zip(alone, r))
        assert r.trace.get("kept_chunks") == alone.trace.get("kept_chunks")


def test_answer_through_the_llm_layer_python_and_http(built):
    """With an LLM (a real local OpenAI-compatible server), ``answer`` and ``POST /answer`` give the reader's
    answer and the passages it was given; without one, ``/answer`` is a 501 that says what to configure."""
    from flows.serving.index import NoLLM
    from tests.llm_server import FakeLLMServer

    questions = built["dense"][2]["question"].tolist()[:3]
    store = built["dense"][0]["artifacts_dir"]
    with pytest.raises(NoLLM, match="llm=local"):
        opened(built, "dense").answer(questions[:1])
    with FakeLLMServer() as server:
        llm = ["llm=local", f"llm.base_url={server.base_url}"]
        dense = open_index("method=dense", *SAMPLE, *llm, f"artifacts_dir={store}")
        answers = dense.answer(questions, k=4)
        for a, q, r in zip(answers, questions, opened(built, "dense").retrieve(questions, k=4)):
            assert a.answer == q.split()[-1].strip("?")  # the test server answers with the question's last word
            assert [p.doc_id for p in a.passages] == [p.doc_id for p in r]
            assert a.context == [f"{p.title}: {p.text}" for p in r]
        arch = open_index("method=archrag", *SAMPLE, *llm, "method.summariser=extractive", f"artifacts_dir={store}")
        own = arch.answer(questions[:2], k=5)  # ArchRAG's own adaptive-filtering generation
        assert len(own) == 2 and all(isinstance(a.answer, str) and a.raw for a in own)
        with uvicorn_thread(Service(dense, ServeParams(), api_key=None)) as url:
            reply = httpx.post(f"{url}/answer", json={"questions": questions, "k": 4}, timeout=60)
        assert reply.status_code == 200
        assert [a["answer"] for a in reply.json()["answers"]] == [a.answer for a in answers]
    with uvicorn_thread(Service(opened(built, "dense"), ServeParams(), api_key=None)) as url:
        refused = httpx.post(f"{url}/answer", json={"question": questions[0]})
    assert refused.status_code == 501 and "llm=local" in refused.json()["error"]


def test_docs_stage_diagrams_name_the_stages_each_method_runs(built):
    """Each method page's mermaid diagram (docs/methods/*.md) names exactly the stages its evaluate run recorded,
    less those evaluate adds beside the index (flows.commands.report.INDEX_EXCLUDED): the diagrams cannot drift from the DAGs."""
    import json

    from flows.commands.report import INDEX_EXCLUDED
    from tasks.core.store import Store
    from tests.test_docs import method_diagrams

    diagrams = method_diagrams()
    for method in METHOD_NAMES:
        cfg = built[method][0]
        run_dir = Path(cfg["artifacts_dir"]).parent / f"run-{method}"
        run_id = json.loads((run_dir / "metrics.json").read_text())["run_id"]
        ran = Store(cfg["artifacts_dir"]).query("SELECT DISTINCT stage FROM stage_events WHERE run_id = ?", [run_id])
        stages = set(ran["stage"]) - set(INDEX_EXCLUDED)
        assert diagrams[method] == stages, f"docs diagram of method={method}: {sorted(diagrams[method])}, ran {sorted(stages)}"
