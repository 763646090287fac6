"""LinearRAG's document nodes (beyond the paper): the paper's graph untouched for independent passages, a networkx
PPR oracle on the graph with the nodes, and the passages of a seeded document lifted through them."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp

from tasks.data.corpus import documents_cut
from tasks.methods.linearrag import algorithm as lr


def _corpus(seed: int, n_p: int = 14, n_e: int = 10, q: int = 3):
    rng = np.random.default_rng(seed)
    contain = sp.csr_array((rng.random((n_p, n_e)) < 0.2) * rng.integers(1, 4, (n_p, n_e)).astype(np.float64))
    similarity = rng.uniform(0.1, 0.9, (q, n_p))
    dense = (rng.random((q, n_e)) < 0.3) * rng.uniform(0.5, 1.0, (q, n_e))
    dense[:, 0] = 1.0  # every query has an active entity (no dense fallback)
    act = sp.csr_array(dense)
    level = act.copy()
    level.data[:] = 1.0
    return contain, similarity, lr.Bridging(act.astype(np.float32), level, [])


def test_independent_passages_keep_the_papers_graph_and_scores():
    contain, similarity, bridging = _corpus(0)
    own = np.array([f"p{i}" for i in range(contain.shape[0])], dtype=object)
    assert (lr.with_document_nodes(contain, own) != contain).nnz == 0
    params = lr.LinearRAGParams(ppr_tol=1e-12)
    paper = lr.global_importance(similarity, bridging, contain, lr.passage_entity_graph(contain, "share"), params)
    graph = lr.passage_entity_graph(lr.with_document_nodes(contain, own), "share")
    np.testing.assert_array_equal(lr.global_importance(similarity, bridging, contain, graph, params), paper)


@pytest.mark.parametrize("seed", [0, 1])
def test_ppr_with_document_nodes_matches_networkx(seed: int):
    contain, similarity, bridging = _corpus(seed)
    n_p, n_e = contain.shape
    source = np.array(["A"] * 5 + ["B"] * 4 + [f"own{i}" for i in range(n_p - 9)], dtype=object)
    augmented = lr.with_document_nodes(contain, source)
    assert augmented.shape == (n_p, n_e + 2)  # A and B hold several passages; the others none
    params = lr.LinearRAGParams(ppr_tol=1e-13, ppr_max_iter=2000, ppr_dtype="float64")
    graph = lr.passage_entity_graph(augmented, "share")
    ours = lr.global_importance(similarity, bridging, contain, graph, params)
    passage_reset = lr.passage_initial_scores(similarity, bridging.activation, bridging.level, contain,
                                              params.passage_ratio, params.passage_node_weight)
    g = nx.from_scipy_sparse_array(sp.csr_array(graph), create_using=nx.DiGraph)
    for qi in range(similarity.shape[0]):
        reset = np.concatenate([passage_reset[qi], bridging.activation.toarray()[qi], np.zeros(2)])
        ref = nx.pagerank(g, alpha=params.damping, personalization=dict(enumerate(reset)), tol=1e-14, max_iter=5000)
        np.testing.assert_allclose(ours[qi], [ref[i] for i in range(n_p)], rtol=1e-6, atol=1e-9)


def test_a_passage_without_entities_gains_from_its_seeded_document():
    # passages 0-2 cut from one document; passage 0 names the seed entity, passage 1 names nothing
    contain = sp.csr_array(np.array([[2, 0], [0, 0], [0, 1], [0, 1]], dtype=np.float64))
    similarity = np.array([[0.5, 0.5, 0.5, 0.5]])
    act = sp.csr_array(np.array([[1.0, 0.0]], dtype=np.float32))
    bridging = lr.Bridging(act, act.copy(), [])
    params = lr.LinearRAGParams(ppr_tol=1e-12)
    source = np.array(["D", "D", "D", "other"], dtype=object)
    plain = lr.global_importance(similarity, bridging, contain, lr.passage_entity_graph(contain, "share"), params)
    linked = lr.global_importance(similarity, bridging, contain,
                                  lr.passage_entity_graph(lr.with_document_nodes(contain, source), "share"), params)
    assert linked[0, 1] > plain[0, 1]  # reached through the document's node
    assert linked[0, 1] > linked[0, 3]  # above a passage of another document with the same reset


def test_auto_passage_reset_follows_the_corpus():
    """``passage_reset=auto`` (beyond the paper): eq. (7) on independent passages, top_similarity on cut documents."""
    own = np.array([f"p{i}" for i in range(4)], dtype=object)
    cut = np.array(["D", "D", "E", "F"], dtype=object)
    assert not documents_cut(own) and documents_cut(cut) and not documents_cut(np.array([], dtype=object))
    assert lr.resolve_passage_reset("auto", documents_cut(own)) == "eq7"
    assert lr.resolve_passage_reset("auto", documents_cut(cut)) == "top_similarity"
    assert lr.resolve_passage_reset("eq7", True) == "eq7" and lr.resolve_passage_reset("top_similarity", False) == "top_similarity"
    contain, similarity, bridging = _corpus(0, n_p=4)
    with pytest.raises(ValueError, match="resolve_passage_reset"):  # never walked unresolved
        lr.global_importance(similarity, bridging, contain, lr.passage_entity_graph(contain, "share"),
                             lr.LinearRAGParams(passage_reset="auto"))
