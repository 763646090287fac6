"""The harness's passage rule over what C-HNSW retrieved, on hand-made inputs."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.data.corpus import documents_cut, source_documents
from tasks.methods.archrag.retriever import (
    append_passages,
    chunk_neighbours,
    document_text,
    entity_documents,
    entity_rank_passages,
    passage_spread,
    rank_passages,
    resolve_rule,
    source_relevance_passages,
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
    cut = lambda documents: documents_cut(source_documents(documents))  # noqa: E731
    assert not cut(unsplit) and not cut(benchmark) and cut(split)
    assert not cut(pd.DataFrame({"doc_id": ["a"]}))
    assert resolve_rule("auto", unsplit) == resolve_rule("auto", benchmark) == "entity_rank"
    assert resolve_rule("auto", split) == "source_relevance"
    assert resolve_rule("entity_rank", split) == "entity_rank"  # an explicit rule is kept


# one document of ten words "w0 w1 ... w9" cut into three passages (p0, p1 overlapping by one word, a gap before p2)
# and a document that is one passage; chunks of 4 words sharing 1: words 0-3, 3-6, 6-9
WORDS = " ".join(f"w{i}" for i in range(10))
SPANS = [(0, 8), (6, 17), (18, 29)]
LINEAGE = pd.DataFrame({"document": ["A", "A", "A", "B"], "char_start": [s for s, _ in SPANS] + [0],
                        "char_end": [e for _, e in SPANS] + [5]})
TEXTS = [WORDS[s:e] for s, e in SPANS] + ["other"]


def test_a_document_is_put_back_together_from_its_passages():
    order = [2, 0, 1]  # any order of its passages
    text = document_text(np.array([SPANS[i][0] for i in order]), np.array([SPANS[i][1] for i in order]),
                         [TEXTS[i] for i in order])
    assert text == WORDS


def test_passages_are_neighbours_where_they_share_a_chunk_of_their_document():
    near = chunk_neighbours(LINEAGE, TEXTS, window_tokens=4, overlap_tokens=1).toarray()
    # chunk w0-w3 holds p0 and p1, w3-w6 holds p1 and p2, w6-w9 holds p2: p0 and p2 share none
    assert near.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 1]]
    # a chunk as long as the document: its passages are all neighbours; documents never meet each other
    assert chunk_neighbours(LINEAGE, TEXTS, 600, 100).toarray().tolist() == [[1, 1, 1, 0], [1, 1, 1, 0],
                                                                            [1, 1, 1, 0], [0, 0, 0, 1]]


def test_unsplit_passages_are_only_their_own_neighbours():
    own = pd.DataFrame({"document": ["a", "b", "c"], "char_start": [0, 0, 0], "char_end": [9, 9, 9]})
    near = chunk_neighbours(own, ["one two three"] * 3, window_tokens=1, overlap_tokens=0)
    assert near.toarray().tolist() == np.eye(3).tolist()


def test_a_passage_naming_no_entity_is_a_source_through_its_chunk():
    # e0 is named in p0 only, e1 in B only; p2 names nothing. Retrieving e0 reaches p1 through chunk w0-w3,
    # never p2 (no chunk with p0) nor B (another document)
    entities = pd.DataFrame({"entity_id": [0, 1], "chunk_ids": [["c0"], ["c3"]]})
    chunks = pd.DataFrame({"chunk_id": ["c0", "c3"], "doc_id": ["p0", "B"]})
    docs = np.array(["p0", "p1", "p2", "B"], dtype=object)
    own = entity_documents(entities, chunks, docs)
    by_chunk = own @ chunk_neighbours(LINEAGE, TEXTS, 4, 1)
    found = [(np.array([[0]]), np.array([[0.9]], np.float32))]
    sims = np.array([[0.1, 0.5, 0.9, 0.8]])
    assert source_relevance_passages(found, [own], sims, 4)[0].tolist() == [[0, -1, -1, -1]]
    assert source_relevance_passages(found, [by_chunk], sims, 4)[0].tolist() == [[1, 0, -1, -1]]
