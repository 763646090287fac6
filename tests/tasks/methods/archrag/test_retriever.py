"""The harness's passage rule over what C-HNSW retrieved, on hand-made inputs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.methods.archrag.retriever import (
    append_passages,
    entity_documents,
    entity_rank_passages,
    passage_spread,
    rank_passages,
    resolve_rule,
    source_relevance_passages,
    split_corpus,
    spread_matrices,
)

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


def test_entity_rank_puts_the_passages_of_the_best_ranked_entity_first():
    docs = entity_documents(ENTITIES, CHUNKS, DOCS)  # e0: d0; e1: d0, d1; e2: d2; e3: d1
    # query 0 ranks e3 > e2 > e1 (by similarity, not by position); query 1 retrieved e1 only; query 2 nothing
    ids = np.array([[1, 3, 2], [1, -1, -1], [-1, -1, -1]])
    sims = np.array([[0.2, 0.9, 0.5], [0.7, 0.0, 0.0], [0.0, 0.0, 0.0]])
    top, score = entity_rank_passages(ids, sims, docs, 3)
    # q0: d1 (e3, rank 0), d2 (e2, rank 1), d0 (e1, rank 2); q1: d0 and d1 tie on e1 and on the count: corpus order
    assert top.tolist() == [[1, 2, 0], [0, 1, -1], [-1, -1, -1]]
    assert score[0].tolist() == [0.0, -1.0, -2.0] and score[1][:2].tolist() == [0.0, 0.0]
    # a passage that mentions two of the retrieved entities leads among the passages of its best entity
    top, _ = entity_rank_passages(np.array([[1, 0]]), np.array([[0.9, 0.1]]), docs, 2)
    assert top.tolist() == [[0, 1]]  # d0 holds e1 and e0, d1 e1 alone


def test_appended_passages_come_after_the_own_ones_once_each():
    own, own_s = np.array([[2, 0, -1], [-1, -1, -1]]), np.array([[0.0, -1.0, -np.inf], [-np.inf] * 3])
    top, score = append_passages(own, own_s, np.array([[0, 1], [1, 2]]), 3)
    assert top.tolist() == [[2, 0, 1], [1, 2, -1]]
    assert score[0][2] < score[0][1] and score[1][0] > score[1][1]


def test_source_relevance_ranks_the_sources_of_every_retrieved_item_by_cosine():
    spread = passage_spread(spread_matrices(PARENTS, 4), entity_documents(ENTITIES, CHUNKS, DOCS))
    sims = np.array([[0.1, 0.3, 0.9], [0.5, 0.2, 0.4]])
    # q0: entity e0 (d0) and community 1 of layer 1 ({e2, e3}: d2, d1); q1: entity e2 only (d2), no community
    found = [(np.array([[0], [2]]), np.array([[0.7], [0.6]], np.float32)),
             (np.array([[1], [-1]]), np.array([[0.4], [0.0]], np.float32))]
    idx, scores, n_sources = source_relevance_passages(found, spread, sims, 3)
    # q0: every passage is a source, by cosine; q1: d2 alone, though d0 is closer to the question
    assert idx.tolist() == [[2, 1, 0], [2, -1, -1]]
    assert scores[0].tolist() == [0.9, 0.3, 0.1] and scores[1][0] == 0.4 and n_sources.tolist() == [3, 1]
    # the same sources, one query at a time
    for i in range(2):
        one = [(ids[i:i + 1], s[i:i + 1]) for ids, s in found]
        assert source_relevance_passages(one, spread, sims[i:i + 1], 3)[0][0].tolist() == idx[i].tolist()


def test_auto_rule_is_source_relevance_only_where_a_document_holds_several_passages():
    unsplit = pd.DataFrame({"doc_id": ["a", "b"], "document": ["a", "b"]})
    benchmark = pd.DataFrame({"doc_id": ["a", "b"], "document": [None, None]})  # no lineage: own documents
    split = pd.DataFrame({"doc_id": ["a#0", "a#1", "b"], "document": ["a", "a", "b"]})
    assert not split_corpus(unsplit) and not split_corpus(benchmark) and split_corpus(split)
    assert not split_corpus(pd.DataFrame({"doc_id": ["a"]}))
    assert resolve_rule("auto", unsplit) == resolve_rule("auto", benchmark) == "entity_rank"
    assert resolve_rule("auto", split) == "source_relevance"
    assert resolve_rule("entity_rank", split) == "entity_rank"  # an explicit rule is kept
