"""ArchRAG's LLM-based hierarchical clustering (Wang et al., 2025, §3.1.2, Algorithm 1), pure numpy/scipy.

One iteration per layer: (1) augment the graph with attribute kNN edges (line 3), (2) weight every edge
by its endpoints' attribute similarity (lines 4–5), (3) cluster the weighted graph (line 6), (4) summarise
each community (line 7; a callback, the summaries are the caller's), (5) build the next layer's graph, a
node per community, linked through the original relations between their members (line 9), until the
termination condition holds (line 10).

Layer 0 is the knowledge graph's entities; layer l is the level-l attributed communities. Node
attributes are unit embeddings (entity name + description, community summary).

Clustering is weighted Leiden (leidenalg, with a hard community-size cap) or, for the Table 4 ablations,
spectral clustering (scikit-learn). Quality measures of §4.3 / App. B.1 (eqs. 5–6) are here too.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import scipy.sparse as sp

from tasks.graph.knn import check_search, knn_graph

EDGE_WEIGHTS = ("cos", "one_minus_cos")
CLUSTERINGS = ("leiden", "spectral")


@dataclass(frozen=True)
class ClusterParams:
    """Algorithm 1's knobs. Defaults: App. B.2 and the authors' released index script (notes §2)."""

    augment: bool = True  # line 3: kNN augmentation (Table 4 "Spec. (No Aug)" turns it off)
    k_scale: float = 1.0  # App. B.2: K = mean degree of the non-isolated nodes, times this scale
    percentile: float = 0.8  # code: a new edge needs cos above this percentile of the existing edges' cos
    edge_weight: str = "cos"  # code: cos clipped at 0 | one_minus_cos: Alg. 1 line 5 as printed
    attribute_weights: bool = True  # False: keep the relation-count weights (Table 4 "Leiden" ablation)
    clustering: str = "leiden"  # leiden | spectral (Table 4 "Spec." ablations)
    max_cluster_size: int = 15  # code: the community-size cap
    resolution: float = 1.0  # Leiden's resolution (RB configuration; 1.0 = modularity)
    min_clusters: int = 10  # code (index.sh): a level with fewer communities is discarded and the loop stops
    max_level: int = 6  # code (index.sh): community levels at most
    seed: int = 0
    # beyond the paper, for 100,000 passages: line 3's kNN search, exact (time ~ n²) or an inverted file
    knn_search: str = "exact"  # exact | ivf | auto: exact up to knn_exact_max nodes in a layer, ivf above
    knn_exact_max: int = 50_000
    ivf_nlist: int = 0  # k-means cells (0: sqrt(n))
    ivf_nprobe: int = 8  # cells searched per node

    def __post_init__(self) -> None:
        check_search(self.knn_search)
        if self.edge_weight not in EDGE_WEIGHTS:
            raise ValueError(f"edge_weight must be one of {EDGE_WEIGHTS}, got {self.edge_weight!r}")
        if self.clustering not in CLUSTERINGS:
            raise ValueError(f"clustering must be one of {CLUSTERINGS}, got {self.clustering!r}")
        if not 0.0 <= self.percentile <= 1.0:
            raise ValueError(f"percentile must be in [0, 1], got {self.percentile}")
        if self.max_cluster_size < 1 or self.min_clusters < 1 or self.max_level < 0 or self.k_scale < 0:
            raise ValueError("max_cluster_size and min_clusters must be >= 1, max_level and k_scale >= 0")


# ---------------------------------------------------------------- graph helpers


def symmetric_pattern(adjacency: sp.sparray) -> sp.csr_array:
    """The undirected edge set of ``adjacency`` (either direction counts), no self loops, weights kept (sum)."""
    a = sp.csr_array(adjacency, dtype=np.float64)
    a = a + a.T
    a.setdiag(0)
    a.eliminate_zeros()
    return a


def edge_cosines(pattern: sp.csr_array, emb: np.ndarray) -> sp.csr_array:
    """The same edges, each weighted by the cosine of its endpoints' unit attributes."""
    coo = pattern.tocoo()
    cos = np.einsum("ij,ij->i", emb[coo.row], emb[coo.col]) if coo.nnz else np.zeros(0)
    return sp.csr_array((cos.astype(np.float64), (coo.row, coo.col)), shape=pattern.shape)


def knn_k(pattern: sp.csr_array, k_scale: float) -> int:
    """App. B.2: K = the mean degree of the non-isolated nodes (code: int of it), times ``k_scale``."""
    degree = np.diff(pattern.indptr)
    linked = degree[degree > 0]
    return int(int(linked.mean()) * k_scale) if linked.size else 0


def knn_augment(pattern: sp.csr_array, emb: np.ndarray, k_scale: float, percentile: float, search: str = "exact",
                exact_max: int = 50_000, ivf_nlist: int = 0, ivf_nprobe: int = 8) -> sp.csr_array:
    """Alg. 1 line 3 (App. B.2 kNN): the original edges plus, per node, its K most similar nodes whose
    cosine is above the ``percentile`` of the original edges' cosines (union-symmetrised, shared kNN graph).

    Returns the augmented edge set as a 0/1 pattern. With no original edge there is no threshold and no K:
    nothing is added (our choice; the code would fail on the empty percentile). ``search`` (beyond the paper):
    exact, ivf (approximate lists) or auto (exact up to ``exact_max`` nodes).
    """
    cos = edge_cosines(pattern, emb).data
    k = knn_k(pattern, k_scale)
    if cos.size == 0 or k == 0:
        return _ones(pattern)
    threshold = float(np.percentile(cos, 100.0 * percentile))
    added = knn_graph(np.ascontiguousarray(emb, dtype=np.float32), k=min(k, emb.shape[0] - 1),
                      min_similarity=threshold, symmetrise="union",
                      search=search, exact_max=exact_max, ivf_nlist=ivf_nlist, ivf_nprobe=ivf_nprobe)
    return _ones(_ones(pattern) + _ones(added))


def _ones(a: sp.sparray) -> sp.csr_array:
    out = sp.csr_array(a, dtype=np.float64, copy=True)
    out.data[:] = 1.0
    return out


def attribute_weights(pattern: sp.csr_array, emb: np.ndarray, mode: str) -> sp.csr_array:
    """Alg. 1 lines 4–5: every edge weighted by attribute similarity.

    ``cos`` (the authors' code) clips at 0: Leiden's modularity is defined for non-negative weights, so a
    dissimilar pair is no edge. ``one_minus_cos`` is line 5 as printed (a distance used as a weight).
    """
    w = edge_cosines(pattern, emb)
    w.data = np.clip(w.data, 0.0, None) if mode == "cos" else 1.0 - w.data
    w.eliminate_zeros()
    return w


def canonical_labels(labels: np.ndarray) -> np.ndarray:
    """Community ids renumbered 0..c-1 in order of each community's smallest member."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    return order[inverse].astype(np.int64)


# ---------------------------------------------------------------- clustering (Alg. 1 line 6)


def leiden(weights: sp.csr_array, max_cluster_size: int, resolution: float, seed: int) -> np.ndarray:
    """Weighted Leiden (leidenalg, RB configuration = modularity at resolution 1) with a hard size cap.

    Every node gets a community: an isolated node is a singleton, never dropped (graspologic, which the
    code uses, silently drops them).
    """
    import igraph as ig
    import leidenalg

    n = weights.shape[0]
    upper = sp.triu(weights, k=1).tocoo()
    g = ig.Graph(n=n, edges=np.column_stack([upper.row, upper.col]).tolist(), directed=False)
    g.es["weight"] = upper.data.tolist()
    part = leidenalg.find_partition(g, leidenalg.RBConfigurationVertexPartition, weights="weight",
                                    resolution_parameter=resolution, max_comm_size=max_cluster_size,
                                    n_iterations=-1, seed=seed)
    return canonical_labels(np.asarray(part.membership, dtype=np.int64))


def spectral(weights: sp.csr_array, max_cluster_size: int, seed: int) -> np.ndarray:
    """Spectral clustering of the weighted graph (Table 4 "Spec."): ceil(n / cap) clusters (our choice:
    the paper gives no k; this matches Leiden's cap on average), labels by cluster-QR (deterministic)."""
    from sklearn.cluster import SpectralClustering

    n = weights.shape[0]
    k = max(1, math.ceil(n / max_cluster_size))
    if k >= n:
        return np.arange(n, dtype=np.int64)
    affinity = sp.csr_matrix(weights + sp.eye_array(n) * 1e-6)  # isolated nodes keep a non-zero degree
    affinity.indices, affinity.indptr = affinity.indices.astype(np.int32), affinity.indptr.astype(np.int32)
    model = SpectralClustering(n_clusters=k, affinity="precomputed", assign_labels="cluster_qr", random_state=seed)
    with warnings.catch_warnings():  # a KG is rarely connected; the embedding still separates its components
        warnings.filterwarnings("ignore", message="Graph is not fully connected")
        return canonical_labels(model.fit_predict(affinity))


def cluster(weights: sp.csr_array, params: ClusterParams) -> np.ndarray:
    """Alg. 1 line 6: community label of every node."""
    if params.clustering == "spectral":
        return spectral(weights, params.max_cluster_size, params.seed)
    return leiden(weights, params.max_cluster_size, params.resolution, params.seed)


# ---------------------------------------------------------------- Algorithm 1


def membership(labels: np.ndarray) -> sp.csr_array:
    """n x c 0/1 matrix: node i belongs to community labels[i]."""
    n, c = labels.size, int(labels.max()) + 1 if labels.size else 0
    return sp.csr_array((np.ones(n), (np.arange(n), labels)), shape=(n, c))


def community_graph(relations: sp.csr_array, labels: np.ndarray) -> sp.csr_array:
    """Alg. 1 line 9: a node per community; two are linked by the original relations between their members,
    weighted by how many there are (the code's choice: the augmented edges E' are not carried up)."""
    m = membership(labels)
    g = sp.csr_array(m.T @ relations @ m)
    g.setdiag(0)
    g.eliminate_zeros()
    return g


def layer_weights(relations: sp.csr_array, emb: np.ndarray, params: ClusterParams) -> sp.csr_array:
    """Alg. 1 lines 3–5 for one layer: the graph the clustering sees."""
    pattern = knn_augment(relations, emb, params.k_scale, params.percentile, params.knn_search, params.knn_exact_max,
                          params.ivf_nlist, params.ivf_nprobe) if params.augment else relations
    if not params.attribute_weights:  # structural weights: relation counts; an added kNN edge weighs 1
        added = _ones(pattern) - _ones(relations)
        added.eliminate_zeros()
        return sp.csr_array(relations + added)
    return attribute_weights(_ones(pattern), emb, params.edge_weight)


@dataclass
class Hierarchy:
    """The attributed communities HC of Algorithm 1, layer by layer.

    ``parent[l]`` (l = 0..L-1) maps each node of layer l to its community in layer l+1; layer 0 is the
    entities. ``embeddings[l]`` are layer l's unit attributes. ``stats`` has one dict per community layer.
    """

    parent: list[np.ndarray] = field(default_factory=list)
    embeddings: list[np.ndarray] = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)
    stop_reason: str = ""

    @property
    def n_layers(self) -> int:
        """Layers including the entity layer."""
        return len(self.embeddings)

    def entity_members(self, layer: int) -> sp.csr_array:
        """communities of ``layer`` x entities, 0/1: the entities each community contains (App. A.1)."""
        n0 = self.embeddings[0].shape[0]
        m = sp.eye_array(n0, format="csr")
        for l in range(layer):
            m = sp.csr_array(membership(self.parent[l]).T @ m)
        return m


# summarise(layer, labels of layer-1's nodes) -> unit attributes (c x d) of the new communities
Summarise = Callable[[int, np.ndarray], np.ndarray]


def hierarchical_clustering(relations: sp.sparray, emb: np.ndarray, params: ClusterParams,
                            summarise: Summarise) -> Hierarchy:
    """Algorithm 1: layer after layer of attributed communities over the KG ``relations`` (entities x
    entities, weights = relation counts) with entity attributes ``emb`` (unit rows).

    Termination (line 10, code's rule): a layer with fewer than ``min_clusters`` communities is discarded and
    the loop stops; so does ``max_level``; and (our guard) a layer that merges no node, which would repeat
    forever.
    """
    graph = symmetric_pattern(relations)
    emb = np.asarray(emb, dtype=np.float32)
    h = Hierarchy(embeddings=[emb])
    for level in range(1, params.max_level + 1):
        n = graph.shape[0]
        if n < 2:
            h.stop_reason = f"layer {level - 1} has {n} node(s)"
            break
        weights = layer_weights(graph, emb, params)
        labels = cluster(weights, params)
        c = int(labels.max()) + 1
        if c < params.min_clusters:
            h.stop_reason = f"level {level} had {c} communities < min_clusters={params.min_clusters} (discarded)"
            break
        if c == n:
            h.stop_reason = f"level {level} merged no node"
            break
        emb = np.asarray(summarise(level, labels), dtype=np.float32)
        if emb.shape[0] != c:
            raise ValueError(f"summarise returned {emb.shape[0]} attributes for {c} communities")
        sizes = np.bincount(labels)
        h.stats.append({"level": level, "nodes_below": n, "communities": c, "edges_below": int(graph.nnz // 2),
                        "clustered_edges": int(weights.nnz // 2), "max_size": int(sizes.max()),
                        "singletons": int((sizes == 1).sum()), "mean_size": round(float(sizes.mean()), 3),
                        **community_quality(h.embeddings[-1], labels)})
        h.parent.append(labels)
        h.embeddings.append(emb)
        graph = community_graph(graph, labels)
    else:
        h.stop_reason = f"max_level={params.max_level} reached"
    return h


# ---------------------------------------------------------------- quality (§4.3, App. B.1)


def community_quality(emb: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Calinski–Harabasz index (eq. 5) and mean member-to-centroid cosine (eq. 6) of one layer."""
    n, c = labels.size, int(labels.max()) + 1
    m = membership(labels)
    sizes = np.bincount(labels, minlength=c).astype(np.float64)
    centroids = (m.T @ emb) / sizes[:, None]
    overall = emb.mean(axis=0)
    between = float((sizes * ((centroids - overall) ** 2).sum(axis=1)).sum())
    within = float(((emb - centroids[labels]) ** 2).sum())
    chi = (n - c) / (c - 1) * between / within if c > 1 and within > 0 and n > c else float("nan")
    unit = centroids / np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
    e = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    sim = float(np.einsum("ij,ij->i", e, unit[labels]).mean())  # eq. 6
    return {"chi": round(chi, 4), "sim": round(sim, 4)}
