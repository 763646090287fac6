"""SeRAG's distance layer (eq. 5) over the source documents passages were cut from: reading-order positions,
independent passages unchanged, and an edited document's layer after an update equal to a full build's."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from tasks.methods.serag import algorithm as se

P = se.GraphParams(k_sem=3, max_entity_chunks=6)


def test_passages_of_one_document_are_numbered_in_reading_order():
    # passages in table order: doc A's third, an independent passage, A's first, B's only, A's second
    source = np.array(["A", "x", "A", "B", "A"], dtype=object)
    start = np.array([3000, 0, 0, 0, 1500])
    doc, pos = se.source_positions(source, start, np.arange(5), np.zeros(5, np.int64))
    assert doc[0] == doc[2] == doc[4] and len({doc[0], doc[1], doc[3]}) == 3
    assert pos.tolist() == [2, 0, 0, 0, 1]
    dist = se.distance_layer(doc, pos, sigma=5.0, window=10).toarray()
    step = np.exp(-1 / 50.0)  # eq. 5 at |i - j| = 1, sigma 5
    assert np.isclose(dist[2, 4], step) and np.isclose(dist[4, 0], step) and np.isclose(dist[2, 0], step ** 4)
    assert dist[1].sum() == 0 and dist[3].sum() == 0  # alone in their documents: no edge


def test_independent_passages_keep_the_passage_scope_positions():
    # sentence chunks of three independent passages (a benchmark): each passage is its own document
    chunk_passage = np.array([0, 0, 1, 2, 2, 2])
    chunk_position = np.array([0, 1, 0, 0, 1, 2])
    doc, pos = se.source_positions(np.array(["p0", "p1", "p2"], dtype=object), np.zeros(3, np.int64),
                                   chunk_passage, chunk_position)
    np.testing.assert_array_equal(pos, chunk_position)
    ref = se.distance_layer(chunk_passage, chunk_position, 5.0, 10)
    assert (se.distance_layer(doc, pos, 5.0, 10) != ref).nnz == 0
    # whole-passage chunks of independent passages: no distance edge at all (the benchmarks' graph)
    one = se.source_positions(np.arange(4).astype(object), np.zeros(4, np.int64), np.arange(4), np.zeros(4))
    assert se.distance_layer(*one, 5.0, 10).nnz == 0


def test_an_edited_document_grows_to_a_full_builds_distance_layer():
    rng = np.random.default_rng(0)

    def layers(ids, source, start):
        n = len(ids)
        x = rng.normal(size=(n, 6))
        emb = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
        inc = sp.csr_array((rng.random((n, 8)) < 0.3).astype(np.float64))
        doc, pos = se.source_positions(np.array(source, dtype=object), np.array(start), np.arange(n), np.zeros(n))
        return np.array(ids, dtype=object), emb, inc, np.array([f"e{j}" for j in range(8)], dtype=object), doc, pos

    before = layers(["a", "b", "c", "y"], ["D", "D", "D", "E"], [0, 100, 200, 0])
    old = se.build_layers(*before, P)
    # D edited: its middle passage replaced by two new ones, so "c" moves from position 2 to 3
    after = layers(["a", "n1", "n2", "c", "y"], ["D", "D", "D", "D", "E"], [0, 90, 150, 220, 0])
    grown, _ = se.grow_layers(old, *after, P)
    full = se.build_layers(*after, P)
    np.testing.assert_allclose(grown.dist.toarray(), full.dist.toarray(), atol=1e-12)
    assert full.dist[0, 3] > 0 and old.dist[0, 2] > full.dist[0, 3]  # a and c are further apart now
