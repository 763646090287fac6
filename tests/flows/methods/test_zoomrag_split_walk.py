"""ZoomRAG's ``method.split_walk`` (beyond the paper, #58): on documents cut into several passages DocZoom walks with
``split_alpha`` / ``split_steps``; on passages that are their own documents nothing changes."""
from __future__ import annotations

import json

import numpy as np
import pytest
from prefect import flow

import flows.methods.zoomrag as zoom_flow
from flows.runtime.config import load_config
from flows.runtime.pipeline import start_run
from tasks.data.ingest import ingest
from tasks.data.sample import generate_sample
from tasks.data.corpus import documents_cut
from tests.flows.conftest import make_config

BEYOND = ["method=zoomrag", "experiment=beyond_paper", "dataset=jsonl", "dataset.name=longzoom"]


@flow(name="zoomrag-split-walk-test")
def _search(cfg: dict, questions: list[str]) -> tuple[list[list[str]], list[list[float]], object]:
    """Index inside a flow, then search ``questions``: (ranked ids, their scores, the retriever)."""
    conf = load_config(cfg)
    ctx, _ = start_run(conf, "index")
    data = ingest(ctx, conf.dataset, conf.data_dir)
    r = zoom_flow.retriever(data, zoom_flow.index(ctx, data, conf), conf)
    hits = r.search(questions, 10)
    return ([[str(r.doc_ids[d]) for d in row] for row in hits.doc_idx], hits.scores.tolist(), r)


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory):
    """Six long records, each ten generated passages joined: ``(folder, questions)``; the default split cuts
    each record into several passages."""
    root = tmp_path_factory.mktemp("longzoom")
    records, qs = generate_sample(60, 8, 0)
    long = [{"title": f"Handbook {i}", "text": "\n\n".join(f"{r['title']}. {r['text']}" for r in records[i::6])}
            for i in range(6)]
    (root / "corpus.jsonl").write_text("\n".join(json.dumps(r) for r in long))
    return root, [q["question"] for q in qs]


def test_documents_cut_reads_shared_sources():
    assert documents_cut(np.array(["a", "b", "a"], dtype=object))
    assert not documents_cut(np.array(["a", "b", "c"], dtype=object))
    assert not documents_cut(np.array([], dtype=object))


def test_split_walk_is_the_walk_with_split_alpha_and_steps_on_cut_documents_only(long_corpus):
    root, questions = long_corpus
    corpus = f"dataset.path={root / 'corpus.jsonl'}"
    ids, scores, r = _search(make_config(root, *BEYOND, corpus), questions)
    assert r.split and (r.walk.alpha, r.walk.steps) == (0.8, 5)  # the experiment's own walk is 0.1 and 10 steps
    # the oracle: the switch off, the walk's own settings set to split_alpha / split_steps by hand
    same = _search(make_config(root, *BEYOND, corpus, "method.split_walk=false", "method.alpha=0.8",
                               "method.steps=5"), questions)
    assert not same[2].split and (ids, scores) == same[:2]
    off = _search(make_config(root, *BEYOND, corpus, "method.split_walk=false"), questions)
    assert (off[2].walk.alpha, off[2].walk.steps) == (0.1, 10) and off[1] != scores
    # the same records unsplit: every passage its own document, the experiment's walk as it is
    whole = _search(make_config(root, *BEYOND, corpus, "dataset.split.enabled=false"), questions)
    assert not whole[2].split and (whole[2].walk.alpha, whole[2].walk.steps) == (0.1, 10)
