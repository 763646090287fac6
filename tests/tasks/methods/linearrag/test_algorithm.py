"""Tests for tasks/methods/linearrag/algorithm.py: oracles (networkx PPR, per-query runs), hand cases, properties."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from tasks.core.config_check import check_values
import scipy.sparse as sp

from tasks.methods.linearrag import algorithm as lr
from tasks.methods.linearrag.algorithm import (
    LinearRAGParams,
    build_tri_graph,
    initial_activation,
    linearrag_retrieve,
    passage_entity_graph,
    passage_initial_scores,
    query_sentence_relevance,
    semantic_bridging,
)
from tasks.text.ner import is_numeric_label, normalize_entity


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _random_corpus(seed: int, n_p: int = 12, n_s: int = 40, n_e: int = 25, d: int = 8):
    """A random Tri-Graph with embeddings; every sentence mentions 1-3 entities."""
    rng = np.random.default_rng(seed)
    sentence_passage = np.sort(rng.integers(0, n_p, n_s))
    per_sentence = rng.integers(1, 4, n_s)
    mention_sentence = np.repeat(np.arange(n_s), per_sentence)
    mention_entity = rng.integers(0, n_e, mention_sentence.size)
    contain, mention = build_tri_graph(sentence_passage, mention_sentence, mention_entity, n_p, n_s, n_e)
    emb = {k: _unit(rng.normal(size=(n, d))).astype(np.float32)
           for k, n in (("passage", n_p), ("sentence", n_s), ("entity", n_e))}
    return contain, mention, emb, rng


# ---------------------------------- entity normalisation (single source: tasks.text.ner)

@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("The United States", "United States"),
        ("the United States", "united states"),
        ("Obama's", "obama"),
        ("Obama\u2019s", "Obama"),
        ("U.S.", "u.s"),
        ("  New   York,  ", "new york"),
        ("Jean-Luc Picard", "jean luc picard"),
        ("An Apple", "apple"),
    ],
)
def test_normalize_entity_merges_variants(a: str, b: str) -> None:
    assert normalize_entity(a) == normalize_entity(b)


def test_normalize_entity_exact_forms() -> None:
    assert normalize_entity("Obama's") == "obama"
    assert normalize_entity("The United States") == "united states"
    assert normalize_entity("Barack  Obama!") == "barack obama"
    assert normalize_entity("A") == "a"  # an article alone is kept, not emptied
    assert normalize_entity("Jean\u2013Luc") == normalize_entity("Jean Luc")  # dashes -> spaces
    assert normalize_entity("Theodore") == "theodore"  # "the" prefix of a word is not an article


def test_is_numeric_label() -> None:
    for label in ("DATE", "TIME", "PERCENT", "MONEY", "QUANTITY", "ORDINAL", "CARDINAL"):
        assert is_numeric_label(label)
    for label in ("PERSON", "ORG", "GPE", "WORK_OF_ART"):
        assert not is_numeric_label(label)


# ----------------------------------------------------------------------------- Tri-Graph

def test_build_tri_graph_hand_example() -> None:
    # passage 0 = sentences 0, 1; passage 1 = sentence 2
    # s0 mentions e0 twice and e1; s1 mentions e0; s2 mentions e2
    contain, mention = build_tri_graph(
        sentence_passage=np.array([0, 0, 1]),
        mention_sentence=np.array([0, 0, 0, 1, 2]),
        mention_entity=np.array([0, 0, 1, 0, 2]),
        n_passages=2, n_sentences=3, n_entities=4,
    )
    np.testing.assert_array_equal(contain.toarray(), [[3, 1, 0, 0], [0, 0, 1, 0]])
    np.testing.assert_array_equal(mention.toarray(), [[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]])
    assert sp.issparse(contain) and contain.format == "csr" and mention.format == "csr"


def test_passage_entity_graph_is_symmetric_bipartite() -> None:
    contain = sp.csr_array(np.array([[3.0, 1.0, 0.0], [0.0, 0.0, 2.0]]))
    adj = passage_entity_graph(contain).toarray()
    assert adj.shape == (5, 5)
    np.testing.assert_array_equal(adj, adj.T)
    np.testing.assert_array_equal(adj[:2, 2:], [[1, 1, 0], [0, 0, 1]])
    assert not adj[:2, :2].any() and not adj[2:, 2:].any()
    assert contain.toarray()[0, 0] == 3.0  # input untouched
    share = passage_entity_graph(contain, weighting="share").toarray()
    np.testing.assert_allclose(share[:2, 2:], [[0.75, 0.25, 0], [0, 0, 1]])
    np.testing.assert_array_equal(passage_entity_graph(contain, weighting="count").toarray()[:2, 2:], contain.toarray())


# -------------------------------------------------------------------- initial activation

def test_initial_activation_links_argmax_keeps_max_and_floor() -> None:
    entity_emb = np.eye(3, dtype=np.float32)
    q0 = _unit(np.array([[1.0, 0.2, 0.0], [0.9, 0.0, 0.1]]))  # both link to entity 0
    q1 = _unit(np.array([[0.1, 0.1, 1.0]]))
    q2 = np.zeros((0, 3))  # no entity in the query
    act = initial_activation([q0, q1, q2], entity_emb).toarray()
    assert act.shape == (3, 3)
    assert act[0, 0] == pytest.approx(max(q0[0, 0], q0[1, 0]), abs=1e-6)
    assert act[0, 1:].sum() == 0 and act[2].sum() == 0
    assert act[1, 2] == pytest.approx(q1[0, 2], abs=1e-6)
    floored = initial_activation([q0, q1, q2], entity_emb, min_similarity=0.992).toarray()
    assert floored[0, 0] > 0 and floored[1].sum() == 0


def test_initial_activation_flat_form_equals_ragged() -> None:
    rng = np.random.default_rng(3)
    entity_emb = _unit(rng.normal(size=(20, 6))).astype(np.float32)
    ragged = [_unit(rng.normal(size=(k, 6))) for k in (2, 0, 3, 1)]
    q_idx = np.repeat(np.arange(4), [2, 0, 3, 1])
    flat = initial_activation((q_idx, np.vstack(ragged)), entity_emb, n_queries=4, block_rows=2)
    np.testing.assert_allclose(flat.toarray(), initial_activation(ragged, entity_emb).toarray())


# -------------------------------------------------------------------- semantic bridging

def _chain(n_entities: int, relevance: float):
    """Entities e0 - s0 - e1 - s1 - e2 ... : sentence i mentions e_i and e_{i+1}."""
    n_s = n_entities - 1
    rows = np.repeat(np.arange(n_s), 2)
    cols = np.stack([np.arange(n_s), np.arange(1, n_entities)], axis=1).ravel()
    _, mention = build_tri_graph(np.zeros(n_s, int), rows, cols, 1, n_s, n_entities)
    return mention, np.full((1, n_s), relevance, dtype=np.float32)


def test_pruning_stops_when_nothing_passes_threshold() -> None:
    mention, sigma = _chain(6, 0.9)
    seeds = sp.csr_array(([1.0], ([0], [0])), shape=(1, 6))
    out = semantic_bridging(seeds, sigma, mention, iteration_threshold=0.75, max_iterations=10, top_k_sentence=1)
    # 1 -> 0.9 -> 0.81 pass delta = 0.75; the next hop 0.729 does not, so step 3 finds nothing
    assert [e.tolist() for _, e in out.trace] == [[1], [2], []]
    np.testing.assert_allclose(out.activation.toarray(), [[1.0, 0.9, 0.81, 0, 0, 0]], rtol=1e-6)
    np.testing.assert_array_equal(out.level.toarray(), [[1, 2, 3, 0, 0, 0]])
    np.testing.assert_array_equal(out.new_counts(4), [[1, 1, 0, 0]])


def test_max_iterations_counts_tiers_including_seeds() -> None:
    mention, sigma = _chain(6, 0.9)
    seeds = sp.csr_array(([1.0], ([0], [0])), shape=(1, 6))
    out = semantic_bridging(seeds, sigma, mention, iteration_threshold=0.1, max_iterations=3)
    assert len(out.trace) == 2  # tiers 0, 1, 2 as in the paper's Table 10
    assert out.activation.toarray()[0, 3] == 0


def test_threshold_above_all_similarities_means_no_propagation() -> None:
    mention, sigma = _chain(4, 0.9)
    seeds = sp.csr_array(([0.8], ([0], [0])), shape=(1, 4))
    out = semantic_bridging(seeds, sigma, mention, iteration_threshold=0.95, max_iterations=5)
    assert out.trace == []
    np.testing.assert_array_equal(out.activation.toarray(), seeds.toarray().astype(np.float32))
    np.testing.assert_array_equal(out.level.toarray(), [[1, 0, 0, 0]])


def test_top_k_sentence_picks_most_relevant_untraversed_sentences() -> None:
    # e0 is in s0 (-> e1), s1 (-> e2), s2 (-> e3); sigma = 0.5, 0.9, 0.7
    rows, cols = np.array([0, 0, 1, 1, 2, 2]), np.array([0, 1, 0, 2, 0, 3])
    _, mention = build_tri_graph(np.zeros(3, int), rows, cols, 1, 3, 4)
    sigma = np.array([[0.5, 0.9, 0.7]], dtype=np.float32)
    seeds = sp.csr_array(([1.0], ([0], [0])), shape=(1, 4))
    top1 = semantic_bridging(seeds, sigma, mention, 0.1, 2, top_k_sentence=1).activation.toarray()
    top2 = semantic_bridging(seeds, sigma, mention, 0.1, 2, top_k_sentence=2).activation.toarray()
    every = semantic_bridging(seeds, sigma, mention, 0.1, 2, top_k_sentence=None).activation.toarray()
    # eq. (5) taken literally: M^T M has a diagonal, so e0 also collects the sum over its
    # chosen sentences, MAX-ed with its old score
    np.testing.assert_allclose(top1, [[1, 0, 0.9, 0]], rtol=1e-6)
    np.testing.assert_allclose(top2, [[1.6, 0, 0.9, 0.7]], rtol=1e-6)
    np.testing.assert_allclose(every, [[2.1, 0.5, 0.9, 0.7]], rtol=1e-6)


def test_a_sentence_taken_once_is_not_taken_again_by_the_same_query() -> None:
    # s0 holds e0 and e1 (sigma 0.9), s1 holds e1 and e2 (0.6). Step 1: e0 takes s0 and reaches e1. Step 2: e1's
    # best sentence s0 is spent, so with top_k_sentence=1 it takes s1 and reaches e2. Query 1 starts at e1: its
    # step 1 takes s0 too (query 0's pairs are not its own) and reaches e0, whose only sentence is then spent
    rows, cols = np.array([0, 0, 1, 1]), np.array([0, 1, 1, 2])
    _, mention = build_tri_graph(np.zeros(2, int), rows, cols, 1, 2, 3)
    sigma = np.array([[0.9, 0.6], [0.9, 0.6]], dtype=np.float32)
    seeds = sp.csr_array(([1.0, 1.0], ([0, 1], [0, 1])), shape=(2, 3))
    out = semantic_bridging(seeds, sigma, mention, 0.1, 3, top_k_sentence=1)
    assert [(q.tolist(), e.tolist()) for q, e in out.trace] == [([0, 1], [1, 0]), ([0], [2])]
    np.testing.assert_array_equal(out.level.toarray(), [[1, 2, 3], [2, 1, 0]])


def test_pure_eq5_without_top_k_matches_dense_formula() -> None:
    """With every sentence allowed and delta tiny, one step is MAX(M^T(sigma (.) M a), a)."""
    contain, mention, emb, rng = _random_corpus(5)
    seeds = sp.csr_array(np.where(rng.random((3, 25)) < 0.1, rng.random((3, 25)), 0.0))
    sigma = np.abs(rng.normal(size=(3, 40))).astype(np.float32)
    out = semantic_bridging(seeds, sigma, mention, iteration_threshold=1e-12, max_iterations=2, top_k_sentence=None)
    m, a = mention.toarray(), seeds.toarray()
    expected = np.maximum((sigma * (a @ m.T)) @ m, a)
    np.testing.assert_allclose(out.activation.toarray(), expected, rtol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bridging_on_pair_relevance_equals_the_dense_relevance(seed: int) -> None:
    """Eq. (4) computed only for the pairs bridging reads: the same cosines and, on embeddings whose dot
    products are exact in float32 (eighths), the same bridging bit for bit."""
    contain, mention, emb, rng = _random_corpus(seed)
    queries = (rng.integers(-8, 9, size=(6, 8)) / 8).astype(np.float32)
    sentences = (rng.integers(-8, 9, size=(emb["sentence"].shape[0], 8)) / 8).astype(np.float32)
    dense = query_sentence_relevance(queries, sentences)
    pairs = lr.PairRelevance(queries, sentences, chunk=7)  # several chunks
    assert pairs.shape == dense.shape
    q, s = rng.integers(0, 6, 50), rng.integers(0, dense.shape[1], 50)
    assert np.array_equal(pairs[q, s], dense[q, s]) and pairs[q[:0], s[:0]].shape == (0,)
    seeds = sp.csr_array(np.where(rng.random((6, 25)) < 0.15, 0.5 + 0.5 * rng.random((6, 25)), 0.0))
    for kwargs in (dict(iteration_threshold=0.05, max_iterations=4, top_k_sentence=2),
                   dict(iteration_threshold=0.01, max_iterations=3, top_k_sentence=None)):
        want = semantic_bridging(seeds, dense, mention, **kwargs)
        got = semantic_bridging(seeds, pairs, mention, **kwargs)
        assert (got.activation != want.activation).nnz == 0 and (got.level != want.level).nnz == 0
    real = lr.PairRelevance(queries, emb["sentence"])  # unit vectors: equal to rounding
    assert np.allclose(real[q, s], query_sentence_relevance(queries, emb["sentence"])[q, s], atol=1e-6)
    # each pair's dot product is its own: how many pairs are gathered at a time changes no bit
    many_q, many_s = rng.integers(0, 6, 5000), rng.integers(0, dense.shape[1], 5000)
    one_block = lr.PairRelevance(queries, emb["sentence"], chunk=5000)[many_q, many_s]
    for chunk in (1, 7, 2048):
        assert np.array_equal(lr.PairRelevance(queries, emb["sentence"], chunk=chunk)[many_q, many_s], one_block)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bridging_batched_equals_one_query_at_a_time(seed: int) -> None:
    contain, mention, emb, rng = _random_corpus(seed)
    queries = _unit(rng.normal(size=(6, 8))).astype(np.float32)
    sigma = np.abs(query_sentence_relevance(queries, emb["sentence"]))
    seeds = sp.csr_array(np.where(rng.random((6, 25)) < 0.12, 0.5 + 0.5 * rng.random((6, 25)), 0.0))
    kwargs = dict(iteration_threshold=0.2, max_iterations=4, top_k_sentence=2)
    batch = semantic_bridging(seeds, sigma, mention, **kwargs)
    for q in range(6):
        one = semantic_bridging(seeds[[q]], sigma[[q]], mention, **kwargs)
        assert np.abs(batch.activation.toarray()[q] - one.activation.toarray()[0]).max() < 1e-6
        np.testing.assert_array_equal(batch.level.toarray()[q], one.level.toarray()[0])
        for (bq, be), (_, oe) in zip(batch.trace, one.trace):
            assert sorted(be[bq == q].tolist()) == sorted(oe.tolist())


# ---------------------------------------------------------------- passage initial scores

def test_passage_initial_scores_hand_example() -> None:
    contain = sp.csr_array(np.array([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]]))
    activation = sp.csr_array(np.array([[0.8, 0.6]]))
    level = sp.csr_array(np.array([[1.0, 2.0]]))
    sim = np.array([[0.9, 0.5, 0.1]])
    got = passage_initial_scores(sim, activation, level, contain, passage_ratio=0.5, passage_node_weight=0.1)
    dense = np.array([1.0, 0.5, 0.0])  # min-max of sim
    bonus = np.array([0.8 * np.log(3) / 1, 0.6 * np.log(2) / 2, 0.0])
    np.testing.assert_allclose(got, [(0.5 * dense + np.log1p(bonus)) * 0.1], rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_passage_scores_batched_equals_one_query_at_a_time(seed: int) -> None:
    contain, mention, emb, rng = _random_corpus(seed)
    queries = _unit(rng.normal(size=(5, 8))).astype(np.float32)
    seeds = sp.csr_array(np.where(rng.random((5, 25)) < 0.15, rng.random((5, 25)), 0.0))
    bridging = semantic_bridging(seeds, query_sentence_relevance(queries, emb["sentence"]), mention, 0.05, 3, 2)
    sim = queries @ emb["passage"].T
    batch = passage_initial_scores(sim, bridging.activation, bridging.level, contain)
    for q in range(5):
        one = passage_initial_scores(sim[[q]], bridging.activation[[q]], bridging.level[[q]], contain)
        assert np.abs(batch[q] - one[0]).max() < 1e-6


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_precomputed_transposes_give_the_same_bridging_and_passage_scores(seed: int) -> None:
    from tasks.graph.sparse import log1p_transposed, transposed_csr

    contain, mention, emb, rng = _random_corpus(seed)
    queries = _unit(rng.normal(size=(6, 8))).astype(np.float32)
    seeds = sp.csr_array(np.where(rng.random((6, 25)) < 0.2, rng.random((6, 25)), 0.0))
    sigma = query_sentence_relevance(queries, emb["sentence"])
    plain = semantic_bridging(seeds, sigma, mention, 0.05, 3, 2)
    kept = semantic_bridging(seeds, sigma, mention, 0.05, 3, 2, entity_sentence=transposed_csr(mention))
    assert plain.activation.nnz > seeds.nnz  # bridging reached new entities, so M^T was read
    np.testing.assert_array_equal(plain.activation.toarray(), kept.activation.toarray())
    np.testing.assert_array_equal(plain.level.toarray(), kept.level.toarray())
    sim = queries @ emb["passage"].T
    np.testing.assert_array_equal(
        passage_initial_scores(sim, plain.activation, plain.level, contain),
        passage_initial_scores(sim, plain.activation, plain.level, contain,
                               entity_passage_log=log1p_transposed(contain)))


# ------------------------------------------------------------------------- orchestrator

def _two_hop_corpus():
    """Beatrice -> (married) Frederick -> (king of) Germany; passage 1 is the bridge.

    Dense similarity ranks the bridge passage below two distractors; bridging reaches
    Frederick through passage 0's sentence, and PPR carries his mass to passage 1.
    Entities: 0 beatrice, 1 frederick, 2 germany, 3 paris, 4 rome.
    """
    basis = np.eye(10)
    query = basis[0]
    passage_emb = _unit(np.stack([
        0.9 * basis[0] + 0.4 * basis[1],  # P0 Beatrice married Frederick
        0.15 * basis[0] + basis[2],  # P1 Frederick, king of Germany (bridge)
        0.5 * basis[0] + basis[3],  # P2 distractor about Paris
        0.45 * basis[0] + basis[4],  # P3 distractor about Rome
        0.05 * basis[0] + basis[5],  # P4 unrelated
    ]))
    sentence_emb = _unit(np.stack([
        0.9 * basis[0] + 0.3 * basis[1],  # s0 in P0: beatrice, frederick
        0.6 * basis[0] + basis[2] * 0.8,  # s1 in P1: frederick, germany
        0.5 * basis[0] + basis[3],  # s2 in P2: paris
        0.45 * basis[0] + basis[4],  # s3 in P3: rome
        basis[5],  # s4 in P4: no entity
    ]))
    sentence_passage = np.arange(5)
    mention_sentence = np.array([0, 0, 1, 1, 2, 3])
    mention_entity = np.array([0, 1, 1, 2, 3, 4])
    contain, mention = build_tri_graph(sentence_passage, mention_sentence, mention_entity, 5, 5, 5)
    entity_emb = np.eye(5, 10)
    return query, passage_emb, sentence_emb, entity_emb, contain, mention


def test_two_hop_bridge_passage_ranks_above_dense() -> None:
    query, passage_emb, sentence_emb, entity_emb, contain, mention = _two_hop_corpus()
    query_entities = [entity_emb[[0]]]  # "Beatrice" in the question
    params = LinearRAGParams(top_k=5, top_k_sentence=1)
    out = linearrag_retrieve(query[None], query_entities, passage_emb, sentence_emb, entity_emb,
                             contain, mention, params)
    dense_rank = list(np.argsort(-(passage_emb @ query), kind="stable"))
    ours = list(out.ranked[0])
    assert not out.fallback[0]
    assert dense_rank.index(1) == 3
    assert ours.index(1) < dense_rank.index(1)
    assert set(ours[:2]) == {0, 1}
    assert out.bridging.level.toarray()[0, :3].tolist() == [1, 2, 3]  # Beatrice, Frederick, Germany


def test_query_without_linked_entity_falls_back_to_dense() -> None:
    query, passage_emb, sentence_emb, entity_emb, contain, mention = _two_hop_corpus()
    queries = np.stack([query, _unit(query + np.eye(10)[3])])
    query_entities = [entity_emb[[0]], np.zeros((0, 10))]
    out = linearrag_retrieve(queries, query_entities, passage_emb, sentence_emb, entity_emb,
                             contain, mention, LinearRAGParams(top_k=5))
    assert out.fallback.tolist() == [False, True]
    dense = passage_emb @ queries[1]
    np.testing.assert_array_equal(out.ranked[1], np.argsort(-dense, kind="stable"))
    np.testing.assert_allclose(out.scores[1], np.sort(dense)[::-1], rtol=1e-6)
    # a linked entity below the similarity floor also counts as "no linked entity"
    far = [_unit(entity_emb[[0]] + 2 * np.eye(10)[[9]])]
    floored = linearrag_retrieve(query[None], far, passage_emb, sentence_emb, entity_emb, contain, mention,
                                 LinearRAGParams(min_similarity=0.9))
    assert floored.fallback.tolist() == [True]


@pytest.mark.parametrize("seed", [0, 1])
def test_retrieve_batched_equals_one_query_at_a_time(seed: int) -> None:
    contain, mention, emb, rng = _random_corpus(seed)
    queries = _unit(rng.normal(size=(4, 8))).astype(np.float32)
    query_entities = [emb["entity"][rng.choice(25, k, replace=False)] for k in (1, 2, 0, 3)]
    params = LinearRAGParams(iteration_threshold=0.05, ppr_tol=1e-12, ppr_max_iter=500, top_k=12, ppr_dtype="float64")
    args = (emb["passage"], emb["sentence"], emb["entity"], contain, mention, params)
    batch = linearrag_retrieve(queries, query_entities, *args)
    for q in range(4):
        one = linearrag_retrieve(queries[[q]], [query_entities[q]], *args)
        assert np.abs(batch.scores[q] - one.scores[0]).max() < 1e-6
        assert batch.fallback[q] == one.fallback[0]


def test_params_fields_are_the_config_keys() -> None:
    assert set(LinearRAGParams.__dataclass_fields__) == {
        "max_iterations", "iteration_threshold", "top_k_sentence", "passage_ratio", "passage_node_weight",
        "damping", "edge_weighting", "top_k", "min_similarity", "ppr_tol", "ppr_max_iter", "ppr_dtype",
        "title_edge_weight", "title_name_weight", "idf_edges", "lowercase_name_weight", "passage_reset", "passage_reset_depth",
        "passage_reset_weight", "ppr_threads", "ppr_sweeps", "relation_gate_temperature", "document_nodes",
    }
    with pytest.raises(ValueError, match="passage_reset"):  # the config check, from the field's metadata
        check_values(LinearRAGParams, "method", {"passage_reset": "bm25"})
    with pytest.raises(Exception):
        LinearRAGParams().damping = 0.9  # type: ignore[misc]


def test_pure_layer_imports_only_numeric_libraries() -> None:
    tree = ast.parse(Path(lr.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    roots = {name.split(".")[0] for name in imported if not name.startswith("tasks.graph.") and name != "tasks.core.limits"}
    assert roots <= {"__future__", "dataclasses", "typing", "numpy", "scipy"}  # tasks.graph and the limits too


# ------------------------------------------------------------------ ranking and online side

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rank_passages_equals_stable_argsort_with_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 4, size=(5, 30)).astype(float)  # many ties
    for k in (1, 7, 30, 40):
        ranked, top = lr.rank_passages(scores, k)
        expected = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(ranked, expected)
        np.testing.assert_array_equal(top, np.take_along_axis(scores, expected, 1))


def test_passage_ratio_is_lambda_of_eq7() -> None:
    """lambda = passage_ratio scales only the min-max dense term; W_p scales the whole reset."""
    contain = sp.csr_array(np.array([[1.0, 0.0], [0.0, 0.0]]))
    act, level = sp.csr_array(np.array([[0.9, 0.0]])), sp.csr_array(np.array([[1.0, 0.0]]))
    sim = np.array([[0.2, 0.8]])  # passage 1: no active entity, best dense match
    a = passage_initial_scores(sim, act, level, contain, passage_ratio=2.0, passage_node_weight=0.05)
    b = passage_initial_scores(sim, act, level, contain, passage_ratio=0.05, passage_node_weight=0.05)
    np.testing.assert_allclose(a[0], [np.log1p(0.9 * np.log(2)) * 0.05, 2.0 * 0.05])
    assert a[0, 1] > a[0, 0] and b[0, 1] < b[0, 0]


def test_global_importance_fallback_rows_are_dense_similarity() -> None:
    query, passage_emb, sentence_emb, entity_emb, contain, mention = _two_hop_corpus()
    queries = np.stack([query, _unit(query + np.eye(10)[3])])
    seeds = initial_activation([entity_emb[[0]], np.zeros((0, 10))], entity_emb)
    bridging = lr.activate_entities(queries, seeds, sentence_emb, mention, LinearRAGParams())
    sim = queries @ passage_emb.T
    graph = passage_entity_graph(contain, "share")
    scores = lr.global_importance(sim, bridging, contain, graph, LinearRAGParams())
    np.testing.assert_array_equal(scores[1], sim[1])
    # PPR mass; every passage but the dense minimum (min-max 0, no entity) gets reset mass
    assert scores[0].sum() < 1.0 and (scores[0, :4] > 0).all() and scores[0, 4] == 0


def test_exact_vocabulary_strings_link_with_similarity_one() -> None:
    from tasks.methods.linearrag.retriever import LinearRetriever
    from tasks.methods.linearrag.params import LinearParams
    from tasks.text.embed import EmbedderParams

    r = LinearRetriever.__new__(LinearRetriever)
    names = np.array(["beatrice", "frederick", "germany"], dtype=object)
    r.entity_names, r.entity_emb = names, np.eye(3, 8, dtype=np.float32)
    r.vocab_index = {n: i for i, n in enumerate(names)}
    r.params = LinearParams()
    r.algo, r.embedder = r.params.retrieval(), EmbedderParams()
    q_idx, col, unseen = r.lookup([["germany", "beatrice"], [], ["frederick", "paris"]])
    assert q_idx.tolist() == [0, 0, 2, 2] and col.tolist() == [2, 0, 1, -1] and unseen == ["paris"]
    near_beatrice = _unit(np.array([[0.6, 0.1, 0, 0, 0, 0, 0, 0.5]])).astype(np.float32)
    seeds = r.seed_activation(3, q_idx, col, near_beatrice)
    np.testing.assert_allclose(seeds.toarray(), [[1, 0, 1], [0, 0, 0], [near_beatrice[0, 0], 1, 0]], rtol=1e-6)
    # beyond the paper (query_linking: gazetteer): exact links weigh their IDF, and the names a question
    # contains are seeds too ('frederick' in question 1, which NER missed)
    from tasks.text.gazetteer import Gazetteer

    r.params = LinearParams(query_linking="gazetteer")
    r.gazetteer, r.idf = Gazetteer.of(names), np.array([1.0, 0.5, 0.25])
    questions = ["Whom did Beatrice marry in Germany?", "Was frederick's son king?", "Frederick in Paris"]
    seeds = r.seed_activation(3, q_idx, col, near_beatrice, questions)
    np.testing.assert_allclose(seeds.toarray(), [[1, 0, 0.25], [0, 0.5, 0], [near_beatrice[0, 0], 0.5, 0]],
                               rtol=1e-6)


# ------------------------------------------------------------- the title walk (beyond the paper)

@pytest.mark.parametrize("weighting", ["share", "count", "indicator"])
def test_title_walk_graph_defaults_are_the_papers_graph(weighting: str) -> None:
    contain, _, _, rng = _random_corpus(3)
    titled = sp.csr_array((np.ones(5), (rng.choice(25, 5, replace=False), np.arange(5))), shape=(25, 12))
    idf = rng.uniform(0.1, 1.0, 25)
    paper = passage_entity_graph(contain, weighting)
    same = lr.title_walk_graph(contain, titled, idf, weighting)
    assert abs(paper - same).max() == 0
    walk = lr.title_walk_graph(contain, titled, idf, weighting, 4.0, 3.0, True)
    assert abs(walk - walk.T).max() > 0  # directed: the title edge is one way


def test_title_walk_graph_hand_example() -> None:
    # passages P0 (mentions a, b) and P1 (mentions b); entity b titles P1; a is in P0 only
    contain = sp.csr_array(np.array([[1.0, 1.0], [0.0, 1.0]]))
    titled = sp.csr_array(np.array([[0.0, 0.0], [0.0, 1.0]]))  # E x P
    idf = np.array([0.5, 1.0])
    g = lr.title_walk_graph(contain, titled, idf, "share", title_edge_weight=4.0, title_name_weight=3.0,
                            idf_edges=True).toarray()
    # passage -> entity: share (0.5, 0.5) for P0, times 3 for the title name b, times idf
    np.testing.assert_allclose(g[0, 2:], [0.5 * 0.5, 0.5 * 3.0 * 1.0])
    np.testing.assert_allclose(g[1, 2:], [0.0, 1.0 * 3.0])
    # entity -> passage: share transposed, plus 4 on b -> P1
    np.testing.assert_allclose(g[2, :2], [0.5, 0.0])
    np.testing.assert_allclose(g[3, :2], [0.5, 1.0 + 4.0])


def test_title_walk_graph_lowercase_names_weigh_less() -> None:
    contain = sp.csr_array(np.array([[1.0, 1.0], [0.0, 1.0]]))
    titled = sp.csr_array(np.array([[0.0, 0.0], [0.0, 1.0]]))
    lowercase = sp.csr_array(np.array([[0.0, 1.0], [0.0, 0.0]]))  # P0 writes b only in lower case
    args = (contain, titled, np.array([0.5, 1.0]), "share", 4.0, 3.0, True)
    base = lr.title_walk_graph(*args).toarray()
    g = lr.title_walk_graph(*args, lowercase, 0.1).toarray()
    np.testing.assert_allclose(g[0, 3], 0.1 * base[0, 3])  # only P0 -> b changes
    g[0, 3] = base[0, 3]
    np.testing.assert_array_equal(g, base)
    assert abs(lr.title_walk_graph(*args, lowercase, 1.0) - lr.title_walk_graph(*args)).max() == 0


def test_top_similarity_reset_hand_example() -> None:
    sim = np.array([[0.9, 0.1, 0.5, 0.3, 0.5]])
    out = lr.top_similarity_reset(sim, depth=2, weight=0.3)
    # top 2: 0.9 and one 0.5; the third (0.5) is the floor, so the 0.5 in the top gets 0
    np.testing.assert_allclose(out.sum(), 0.3)
    assert out[0, 0] == pytest.approx(0.3) and np.count_nonzero(out) == 1
    flat = lr.top_similarity_reset(np.full((2, 4), 0.2), depth=2, weight=1.0)
    np.testing.assert_allclose(flat.sum(axis=1), 1.0)
    assert (np.count_nonzero(flat, axis=1) == 2).all()
    every = lr.top_similarity_reset(sim, depth=10, weight=1.0)  # depth past the corpus: all passages
    np.testing.assert_allclose(every, np.array([[0.8, 0.0, 0.4, 0.2, 0.4]]) / 1.8)


def test_title_walk_reaches_the_bridge_passage_the_paper_walk_misses() -> None:
    """Q names A's title; A's text names B's title; B is unlike the question. The title walk puts B second."""
    # passages: 0 = A (titled a, mentions b), 1 = B (titled b), 2..5 distractors mentioning a hub h
    contain = sp.csr_array(np.array([[1, 1, 0], [0, 1, 0], [0, 0, 1], [0, 0, 1], [0, 0, 1], [1, 0, 1]],
                                    dtype=np.float64))  # entities a, b, h; passage 5 also mentions a
    titled = sp.csr_array(np.array([[1, 0, 0, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=np.float64))
    idf = np.array([0.7, 0.9, 0.2])
    sim = np.array([[0.6, 0.05, 0.4, 0.35, 0.3, 0.5]])  # B is the least similar passage
    seeds = sp.csr_array(np.array([[0.7, 0.0, 0.0]]))  # the question names a
    bridging = lr.Bridging(seeds, sp.csr_array(seeds != 0, dtype=np.float64), [])
    reset = dict(passage_reset="top_similarity", passage_reset_depth=3, damping=0.85, ppr_tol=1e-12,
                 ppr_max_iter=1000, ppr_dtype="float64")
    beyond = LinearRAGParams(title_edge_weight=50.0, title_name_weight=10.0, idf_edges=True, **reset)
    graph = lr.title_walk_graph(contain, titled, idf, "share", 50.0, 10.0, True)
    scores = lr.global_importance(sim, bridging, contain, graph, beyond)
    assert set(np.argsort(-scores[0])[:2]) == {0, 1}
    paper = lr.global_importance(sim, bridging, contain, passage_entity_graph(contain, "share"),
                                 LinearRAGParams(**reset))
    assert list(np.argsort(-paper[0])).index(1) > 1


def test_retriever_dot_through_numpy_equals_torch_and_handles_empty_sides() -> None:
    from tasks.methods.linearrag.retriever import _dot

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((5, 384)).astype(np.float32), rng.standard_normal((700, 384)).astype(np.float32)
    np.testing.assert_allclose(_dot(a, b, via_torch=False), _dot(a, b, via_torch=True), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(_dot(a, b, via_torch=False), a.astype(np.float64) @ b.T.astype(np.float64), atol=1e-3)
    assert _dot(a[:0], b, via_torch=False).shape == (0, 700) and _dot(a, b[:0], via_torch=True).shape == (5, 0)
