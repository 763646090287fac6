"""The harness's passage rule over what C-HNSW retrieved, on hand-made inputs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.methods.archrag.retriever import entity_documents, passage_spread, rank_passages, spread_matrices

# 4 entities in 3 documents: e0 in d0, e1 in d0 and d1 (two chunks of d1), e2 in d2, e3 in d1
ENTITIES = pd.DataFrame({"entity_id": [0, 1, 2, 3],
                         "chunk_ids": [["c0"], ["c0", "c1", "c2"], ["c3"], ["c2"]]})
CHUNKS = pd.DataFrame({"chunk_id": ["c0", "c1", "c2", "c3"], "doc_id": ["d0", "d1", "d1", "d2"]})
DOCS = np.array(["d0", "d1", "d2"], dtype=object)
# layer 1: {e0, e1} -> community 0, {e2, e3} -> community 1; layer 2: both -> community 0
PARENTS = pd.DataFrame({"layer": [0, 0, 0, 0, 1, 1], "node": [0, 1, 2, 3, 0, 1], "parent": [0, 0, 1, 1, 0, 0]})


def test_entity_documents_counts_an_entity_once_per_document():
    m = entity_documents(ENTITIES, CHUNKS, DOCS).toarray()
    assert m.tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 1], [0, 1, 0]]


def test_spread_matrices_share_a_community_evenly_over_its_entities():
    spread = spread_matrices(PARENTS, 4)
    assert [s.shape for s in spread] == [(4, 4), (2, 4), (1, 4)]
    assert spread[1].toarray().tolist() == [[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]]
    assert spread[2].toarray().tolist() == [[0.25, 0.25, 0.25, 0.25]]


def test_rank_passages_by_hand():
    spread = passage_spread(spread_matrices(PARENTS, 4), entity_documents(ENTITIES, CHUNKS, DOCS))
    # query: entity e1 (sim .8), entity e2 (sim -.2: clipped to 0), community 1 of layer 1 (sim .6)
    found = [(np.array([[1, 2]]), np.array([[0.8, -0.2]], np.float32)),
             (np.array([[1]]), np.array([[0.6]], np.float32)),
             (np.zeros((1, 0), np.int64), np.zeros((1, 0), np.float32))]
    idx, scores = rank_passages(found, spread, 3)
    # d0: e0 + e1 = 0.8; d1: e1 + e3 = 0.8 + 0.3; d2: e2 = 0 + 0.3
    assert idx.tolist() == [[1, 0, 2]]
    assert scores[0] == pytest.approx([1.1, 0.8, 0.3])


def test_unscored_passages_are_not_returned():
    spread = passage_spread(spread_matrices(PARENTS, 4), entity_documents(ENTITIES, CHUNKS, DOCS))
    found = [(np.array([[2]]), np.array([[0.5]], np.float32))]
    idx, _ = rank_passages(found, spread, 3)
    assert idx.tolist() == [[2, -1, -1]]


def test_batched_ranking_equals_one_query_at_a_time():
    rng = np.random.default_rng(0)
    spread = passage_spread(spread_matrices(PARENTS, 4), entity_documents(ENTITIES, CHUNKS, DOCS))
    found = [(rng.integers(0, 4, size=(7, 2)), rng.random((7, 2)).astype(np.float32)),
             (rng.integers(0, 2, size=(7, 1)), rng.random((7, 1)).astype(np.float32)),
             (np.zeros((7, 1), np.int64), rng.random((7, 1)).astype(np.float32))]
    batch_idx, batch_scores = rank_passages(found, spread, 3)
    for i in range(7):
        one = [(ids[i:i + 1], sims[i:i + 1]) for ids, sims in found]
        idx, scores = rank_passages(one, spread, 3)
        assert idx[0].tolist() == batch_idx[i].tolist()
        assert scores[0] == pytest.approx(batch_scores[i])
