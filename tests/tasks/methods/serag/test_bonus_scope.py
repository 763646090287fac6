"""SeRAG's entity bonus scoped to the source document (beyond the paper): which chunks share a bonus, the shared
value against a loop over the groups, passages that are their own documents left with eq. 13's own bonus, and the
ranking inside one document left to the passage's own cosine and community term."""
from __future__ import annotations

import numpy as np

from tasks.methods.serag import algorithm as se


def test_independent_passages_share_nothing():
    # every passage its own document (a benchmark), one chunk each or sentence chunks: eq. 13's bonus as it is
    assert se.bonus_groups(np.arange(4), np.array(["p0", "p1", "p2", "p3"], dtype=object)) is None
    assert se.bonus_groups(np.array([0, 0, 1, 2, 2]), np.array(["p0", "p1", "p2"], dtype=object)) is None


def test_chunks_of_one_cut_document_form_one_group():
    # passages: two of document A, one alone in B, one more of A; sentence chunks of the lone passage stay apart
    source = np.array(["A", "A", "B", "A"], dtype=object)
    chunk_passage = np.array([0, 1, 2, 2, 3])
    group, n_groups = se.bonus_groups(chunk_passage, source)
    assert n_groups == 3 and group[0] == group[1] == group[4]
    assert len({group[0], group[2], group[3]}) == 3


def test_document_bonus_is_the_groups_largest_bonus():
    rng = np.random.default_rng(0)
    source = rng.integers(0, 5, size=30).astype(str).astype(object)
    chunk_passage = np.sort(rng.integers(0, 30, size=60))
    bonus = np.where(rng.random((4, 60)) < 0.3, rng.random((4, 60)) * 3, 0.0)
    group, n_groups = se.bonus_groups(chunk_passage, source)
    shared = se.document_bonus(bonus, group, n_groups)
    for j in range(60):  # the oracle: a loop over each chunk's group
        np.testing.assert_array_equal(shared[:, j], bonus[:, group == group[j]].max(axis=1))
    assert (shared >= bonus).all()


def test_inside_a_document_the_order_is_the_bonus_free_order():
    rng = np.random.default_rng(1)
    n, d = 12, 8
    x = rng.normal(size=(n, d))
    chunk_emb = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    q = rng.normal(size=(2, d))
    q_emb = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    community = np.array([0, 0, 1, 1, 2, 2, 0, 1, 2, 0, 1, 2])
    comm_emb = chunk_emb[[0, 2, 4]]
    source = np.array(list("AAAAAABBBBBB"), dtype=object)
    bonus = np.zeros((2, n))
    bonus[:, [1, 7]] = [[2.0, 0.5], [0.3, 1.5]]  # the entity matches of one passage in each document
    p = se.ScoreParams(k_coarse=3)
    group, n_groups = se.bonus_groups(np.arange(n), source)
    scoped, _ = se.hybrid_scores(q_emb, chunk_emb, comm_emb, community, se.document_bonus(bonus, group, n_groups), p)
    plain, _ = se.hybrid_scores(q_emb, chunk_emb, comm_emb, community, np.zeros((2, n)), p)
    for doc in "AB":
        members = np.flatnonzero(source == doc)
        for i in range(2):
            np.testing.assert_array_equal(np.argsort(-scoped[i, members], kind="stable"),
                                          np.argsort(-plain[i, members], kind="stable"))
    # eq. 13 per passage puts the matching passage first in its document instead
    own, _ = se.hybrid_scores(q_emb, chunk_emb, comm_emb, community, bonus, p)
    assert own[0, :6].argmax() == 1 and own[1, 6:].argmax() == 1
