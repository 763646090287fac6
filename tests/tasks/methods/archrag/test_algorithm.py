"""Algorithm 1 (ArchRAG §3.1.2) on small graphs with known answers."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import adjusted_rand_score, calinski_harabasz_score

from tasks.methods.archrag.algorithm import (
    ClusterParams,
    attribute_weights,
    canonical_labels,
    cluster,
    community_graph,
    community_quality,
    hierarchical_clustering,
    knn_augment,
    knn_k,
    layer_weights,
    leiden,
    membership,
    symmetric_pattern,
)


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def planted(groups: int = 6, size: int = 10, p_in: float = 0.6, p_out: float = 0.01, noise: float = 0.3,
            seed: int = 0) -> tuple[sp.csr_array, np.ndarray, np.ndarray]:
    """A planted-partition graph whose node attributes share the groups' themes."""
    rng = np.random.default_rng(seed)
    n = groups * size
    truth = np.arange(n) // size
    emb = unit(rng.normal(size=(groups, 16)).repeat(size, 0) + noise * rng.normal(size=(n, 16)))
    same = truth[:, None] == truth[None, :]
    upper = np.triu(rng.random((n, n)) < np.where(same, p_in, p_out), k=1)
    return sp.csr_array(upper.astype(float)), emb.astype(np.float32), truth


def centroid_summaries(h_emb: list[np.ndarray]):
    """A summarise callback: a community's attribute is its members' normalised centroid."""
    def summarise(level: int, labels: np.ndarray) -> np.ndarray:
        out = unit(np.asarray(membership(labels).T @ h_emb[-1]))
        h_emb.append(out)
        return out
    return summarise


def test_leiden_recovers_a_planted_partition():
    relations, emb, truth = planted()
    h = hierarchical_clustering(relations, emb, ClusterParams(min_clusters=2), centroid_summaries([emb]))
    assert adjusted_rand_score(truth, h.parent[0]) == 1.0
    assert h.stats[0]["communities"] == 6 and h.stats[0]["max_size"] == 10


@pytest.mark.parametrize("augment", [True, False])
def test_spectral_ablations_recover_a_planted_partition(augment):
    relations, emb, truth = planted()
    p = ClusterParams(clustering="spectral", augment=augment, max_cluster_size=10)
    labels = cluster(layer_weights(symmetric_pattern(relations), emb, p), p)
    assert adjusted_rand_score(truth, labels) == 1.0


def test_structure_only_leiden_ablation_uses_relation_counts():
    relations, emb, _ = planted()
    p = ClusterParams(augment=False, attribute_weights=False)
    w = layer_weights(symmetric_pattern(relations), emb, p)
    assert set(np.unique(w.data)) == {1.0}  # counts of a 0/1 graph, no cosine anywhere
    assert w.nnz == symmetric_pattern(relations).nnz


def test_size_cap_is_hard_and_isolated_nodes_are_singletons():
    n = 40
    clique = sp.csr_array(np.triu(np.ones((n, n)), k=1))
    big = sp.block_diag([clique, sp.csr_array((3, 3))], format="csr")  # 3 isolated nodes after the clique
    labels = leiden(symmetric_pattern(big), max_cluster_size=15, resolution=1.0, seed=0)
    assert labels.size == n + 3
    assert np.bincount(labels).max() <= 15
    tail = labels[n:]
    assert len(set(tail)) == 3 and all(np.sum(labels == t) == 1 for t in tail)


def test_knn_augmentation_k_and_threshold():
    # a path 0-1-2-3 (mean degree 1.5 -> K = 1) and node 4 isolated but almost equal to node 0
    emb = unit(np.array([[1, 0, 0], [0.6, 0.8, 0], [0, 1, 0], [0, 0.6, 0.8], [0.99, 0.01, 0.1]], dtype=float))
    path = symmetric_pattern(sp.csr_array(([1.0, 1.0, 1.0], ([0, 1, 2], [1, 2, 3])), shape=(5, 5)))
    assert knn_k(path, 1.0) == 1 and knn_k(path, 2.0) == 2
    aug = knn_augment(path, emb.astype(np.float32), k_scale=1.0, percentile=0.8)
    assert aug[0, 4] == 1 and aug[4, 0] == 1  # cos(0, 4) ~ 0.99, above every path edge's cosine
    assert aug.nnz == path.nnz + 2  # only that pair is new: every other best neighbour is an existing edge
    assert np.array_equal(knn_augment(sp.csr_array((5, 5)), emb, 1.0, 0.8).toarray(), np.zeros((5, 5)))


def test_knn_augmentation_by_inverted_file_is_exact_with_every_cell_probed_and_auto_switches_at_the_limit():
    rng = np.random.default_rng(5)
    emb = unit(rng.normal(size=(800, 8))).astype(np.float32)
    edges = rng.integers(0, 800, size=(1600, 2))
    pattern = symmetric_pattern(sp.csr_array((np.ones(1600), (edges[:, 0], edges[:, 1])), shape=(800, 800)))
    exact = knn_augment(pattern, emb, 1.0, 0.5)
    assert exact.nnz > pattern.nnz + 100  # the kNN lists add edges
    full = knn_augment(pattern, emb, 1.0, 0.5, "ivf", ivf_nlist=10, ivf_nprobe=10)
    assert (full != exact).nnz == 0
    few = knn_augment(pattern, emb, 1.0, 0.5, "ivf", ivf_nlist=10, ivf_nprobe=1)
    assert few.multiply(exact).sum() < exact.nnz  # approximate: some true neighbours missed
    assert (knn_augment(pattern, emb, 1.0, 0.5, "auto", exact_max=800) != exact).nnz == 0
    assert (knn_augment(pattern, emb, 1.0, 0.5, "auto", exact_max=799, ivf_nlist=10, ivf_nprobe=1) != few).nnz == 0
    with pytest.raises(ValueError, match="kNN search"):
        ClusterParams(knn_search="hnsw")


def test_attribute_weights_cos_clipped_or_one_minus_cos():
    emb = unit(np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.1], [0.8, 0.6]]))
    pattern = symmetric_pattern(sp.csr_array(([1.0, 1.0, 1.0], ([0, 0, 0], [1, 2, 3])), shape=(4, 4)))
    cos = attribute_weights(pattern, emb, "cos")
    assert cos[0, 3] == pytest.approx(0.8) and cos[0, 1] == 0 and cos[0, 2] == 0  # 0 and < 0 are no edge
    dist = attribute_weights(pattern, emb, "one_minus_cos")
    assert dist[0, 1] == pytest.approx(1.0) and dist[0, 3] == pytest.approx(0.2)
    assert dist[0, 2] == pytest.approx(1.0 - emb[0] @ emb[2])


def test_community_graph_counts_original_relations_between_members():
    relations = symmetric_pattern(sp.csr_array(([1.0, 1.0, 1.0, 1.0], ([0, 1, 0, 3], [1, 2, 3, 4])),
                                                shape=(5, 5)))
    labels = np.array([0, 0, 1, 1, 1])  # {0,1} and {2,3,4}: relations 1-2 and 0-3 cross
    g = community_graph(relations, labels)
    assert g.toarray().tolist() == [[0.0, 2.0], [2.0, 0.0]]


def test_termination_min_clusters_discards_and_max_level_stops():
    relations, emb, _ = planted()
    h = hierarchical_clustering(relations, emb, ClusterParams(min_clusters=7), centroid_summaries([emb]))
    assert h.n_layers == 1 and "discarded" in h.stop_reason  # 6 communities < 7: no community layer
    h = hierarchical_clustering(relations, emb, ClusterParams(min_clusters=1, max_level=1),
                                centroid_summaries([emb]))
    assert h.n_layers == 2 and "max_level" in h.stop_reason


def test_entity_members_compose_layers():
    relations, emb, truth = planted(groups=8, size=6, p_out=0.05)
    h = hierarchical_clustering(relations, emb, ClusterParams(min_clusters=2, max_cluster_size=16),
                                centroid_summaries([emb]))
    assert h.n_layers >= 3
    for layer in range(1, h.n_layers):
        m = h.entity_members(layer)
        assert m.shape == (h.embeddings[layer].shape[0], 48)
        assert np.array_equal(m.sum(axis=0), np.ones(48))  # every entity in exactly one community per layer
    top = h.parent[1][h.parent[0]]  # entity -> its level-2 community, composed by hand
    assert np.array_equal(h.entity_members(2).toarray().argmax(axis=0), top)


def test_quality_measures_match_their_definitions():
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(30, 5))
    labels = canonical_labels(rng.integers(0, 4, size=30))
    q = community_quality(emb, labels)
    assert q["chi"] == pytest.approx(calinski_harabasz_score(emb, labels), rel=1e-3)
    cent = np.stack([emb[labels == c].mean(0) for c in range(4)])
    sim = np.mean([unit(emb[i:i + 1])[0] @ unit(cent[labels[i]:labels[i] + 1])[0] for i in range(30)])
    assert q["sim"] == pytest.approx(sim, abs=1e-4)


def test_params_are_checked():
    with pytest.raises(ValueError, match="edge_weight"):
        ClusterParams(edge_weight="sin")
    with pytest.raises(ValueError, match="clustering"):
        ClusterParams(clustering="kmeans")
