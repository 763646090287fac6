"""Tests for tasks/graph/encoding_tree.py: the notes' test vectors, brute force over all set partitions,
the direct eq. (1) evaluator vs the compact form, and properties of the greedy merge."""
from __future__ import annotations

import math
from itertools import combinations
from typing import Iterator

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.sparse.csgraph import connected_components

from tasks.graph.encoding_tree import (
    MERGE_ENGINES,
    EncodingTree,
    encoding_tree,
    merge_gain,
    structural_entropy_1d,
    structural_entropy_2d,
    symmetric_weights,
)

TWO_TRIANGLES = [(0, 1), (1, 2), (0, 2), (3, 4), (4, 5), (3, 5)]


def graph(edges: list[tuple[int, int]], n: int, weights: list[float] | None = None) -> sp.csr_array:
    """Symmetric csr_array from an undirected edge list (unit weights unless given)."""
    w = np.ones(len(edges)) if weights is None else np.asarray(weights, dtype=np.float64)
    rows = [a for a, _ in edges] + [b for _, b in edges]
    cols = [b for _, b in edges] + [a for a, _ in edges]
    return sp.csr_array((np.concatenate([w, w]), (rows, cols)), shape=(n, n))


def random_graph(seed: int, n: int, density: float = 0.4, isolated: int = 0) -> sp.csr_array:
    """Random weighted undirected graph (uniform weights, so no ties); the last ``isolated`` nodes have no edge."""
    rng = np.random.default_rng(seed)
    m = n - isolated
    edges = [(a, b) for a, b in combinations(range(m), 2) if rng.random() < density]
    return graph(edges, n, rng.uniform(0.1, 3.0, len(edges)).tolist())


def set_partitions(n: int) -> Iterator[list[int]]:
    """Every partition of {0..n-1}, as a list of block bitmasks (restricted-growth recursion)."""
    def grow(i: int, blocks: list[int]) -> Iterator[list[int]]:
        if i == n:
            yield list(blocks)
            return
        for j in range(len(blocks)):
            blocks[j] |= 1 << i
            yield from grow(i + 1, blocks)
            blocks[j] &= ~(1 << i)
        blocks.append(1 << i)
        yield from grow(i + 1, blocks)
        blocks.pop()
    yield from grow(0, [])


def compact_terms(adj: sp.csr_array) -> tuple[float, float, np.ndarray]:
    """(H¹, vol, f) with f[mask] = in_X log2(vol/V_X) for every node subset X: H² = H¹ - sum_X f[X]/vol."""
    a = adj.toarray()
    n = a.shape[0]
    d = a.sum(axis=1)
    vol = d.sum()
    h1 = -sum(x / vol * math.log2(x / vol) for x in d if x > 0)
    f = np.zeros(1 << n)
    for mask in range(1, 1 << n):
        members = [i for i in range(n) if mask >> i & 1]
        inner = a[np.ix_(members, members)].sum()
        if inner > 0:
            f[mask] = inner * math.log2(vol / d[members].sum())
    return h1, vol, f


def labels_of(blocks: list[int], n: int) -> np.ndarray:
    out = np.zeros(n, dtype=np.int64)
    for j, mask in enumerate(blocks):
        for i in range(n):
            if mask >> i & 1:
                out[i] = j
    return out


def brute_force(adj: sp.csr_array) -> tuple[float, np.ndarray, list[list[int]], np.ndarray]:
    """(optimal H², its labels, every partition, H² of each partition by the compact form)."""
    n = adj.shape[0]
    h1, vol, f = compact_terms(adj)
    parts = list(set_partitions(n))
    h2 = np.array([h1 - sum(f[m] for m in blocks) / vol for blocks in parts])
    best = int(np.argmin(h2))
    return float(h2[best]), labels_of(parts[best], n), parts, h2


def stats(adj: sp.csr_array, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(V_X, g_X, C) per community, C[X, Y] the weight between X and Y, from a dense copy."""
    a = adj.toarray()
    c = labels.max() + 1
    s = np.zeros((len(labels), c))
    s[np.arange(len(labels)), labels] = 1.0
    between = s.T @ a @ s
    volume = between.sum(axis=1)
    return volume, volume - np.diag(between), between


def assert_valid_tree(tree: EncodingTree, adj: sp.csr_array) -> None:
    """Labels 0..c-1 numbered by smallest member, volumes, connected communities."""
    n = adj.shape[0]
    assert tree.community.shape == (n,) and tree.community.dtype == np.int64
    c = tree.n_communities
    assert sorted(set(tree.community.tolist())) == list(range(c))
    firsts = [int(np.flatnonzero(tree.community == x)[0]) for x in range(c)]
    assert firsts == sorted(firsts)
    assert np.allclose(tree.volume, np.bincount(tree.community, weights=adj.sum(axis=1), minlength=c))
    assert tree.n_merges == n - c
    for x in range(c):
        members = np.flatnonzero(tree.community == x)
        sub = adj[members][:, members]
        assert connected_components(sub, directed=False)[0] == 1


# ---------------------------------------------------------------- the notes' test vectors


def test_two_triangles_with_a_bridge():
    adj = graph(TWO_TRIANGLES + [(2, 3)], 6)
    assert structural_entropy_1d(adj) == pytest.approx(2.5566567075, abs=1e-10)
    assert structural_entropy_2d(adj, np.array([0, 0, 0, 1, 1, 1])) == pytest.approx(1.6995138503, abs=1e-10)
    optimum, labels, _, _ = brute_force(adj)
    assert optimum == pytest.approx(1.6995138503, abs=1e-10)
    assert labels.tolist() == [0, 0, 0, 1, 1, 1]
    tree = encoding_tree(adj)
    assert_valid_tree(tree, adj)
    assert tree.entropy_1d == pytest.approx(2.5566567075, abs=1e-10)
    assert optimum - 1e-9 <= tree.entropy_2d < tree.entropy_1d


@pytest.mark.parametrize("engine", MERGE_ENGINES)
def test_greedy_merge_order_on_the_bridge(engine: str):
    # singleton gains: (0,1), (4,5) at log2(14/4), then the bridge (2,3) at log2(14/6) beats adding 2 to {0,1}
    # (2·log2(14/6) = 2.445 > 2·log2(4/7) + 4·log2(14/7) = 2.385, in units of 1/vol): a greedy local optimum
    tree = encoding_tree(graph(TWO_TRIANGLES + [(2, 3)], 6), engine=engine)
    assert tree.community.tolist() == [0, 0, 1, 1, 2, 2]
    volumes = [4.0, 6.0, 4.0]
    want = -sum(g / 14 * math.log2(v / 14) for g, v in zip([2, 4, 2], volumes))
    want -= sum(d / 14 * math.log2(d / v) for d, v in zip([2, 2, 3, 3, 2, 2], [4, 4, 6, 6, 4, 4]))
    assert tree.entropy_2d == pytest.approx(want, abs=1e-12) and tree.volume.tolist() == volumes


def test_two_disjoint_triangles():
    adj = graph(TWO_TRIANGLES, 6)
    tree = encoding_tree(adj)
    assert tree.community.tolist() == [0, 0, 0, 1, 1, 1]
    assert tree.entropy_1d == pytest.approx(math.log2(6), abs=1e-12)
    assert tree.entropy_2d == pytest.approx(math.log2(3), abs=1e-12)
    assert brute_force(adj)[0] == pytest.approx(math.log2(3), abs=1e-12)
    assert tree.volume.tolist() == [6.0, 6.0] and tree.n_merges == 4


def test_two_singletons_gain():
    # notes §1: R = (2w/vol) log2(vol/(d_u+d_v)) for two singletons
    assert merge_gain(3.0, 3.0, 2.0, 2.0, 1.5, 20.0) == pytest.approx(3.0 / 20 * math.log2(20 / 5), abs=1e-15)


# ---------------------------------------------------------------- brute force


@pytest.mark.parametrize("engine", MERGE_ENGINES)
@pytest.mark.parametrize("seed,n,density", [(0, 5, 0.6), (1, 6, 0.5), (2, 7, 0.4), (3, 8, 0.35), (4, 8, 0.6),
                                            (5, 9, 0.3), (6, 9, 0.5)])
def test_greedy_against_every_partition(seed: int, n: int, density: float, engine: str):
    adj = random_graph(seed, n, density)
    optimum, _, parts, h2 = brute_force(adj)
    tree = encoding_tree(adj, engine=engine)
    assert_valid_tree(tree, adj)
    assert tree.entropy_2d >= optimum - 1e-9
    assert tree.entropy_2d <= tree.entropy_1d + 1e-12
    assert tree.entropy_1d == pytest.approx(h2[0 if len(parts[0]) == n else -1], abs=1e-12)  # singletons
    rng = np.random.default_rng(seed)
    for i in [int(np.argmin(h2)), *rng.choice(len(parts), size=40).tolist()]:  # the optimum and a sample
        assert structural_entropy_2d(adj, labels_of(parts[i], n)) == pytest.approx(h2[i], abs=1e-12)
    own = labels_of(parts[0], n)
    assert structural_entropy_2d(adj, own) == pytest.approx(tree.entropy_1d, abs=1e-12)  # one community


# ---------------------------------------------------------------- properties


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 30), density=st.floats(0.05, 0.6),
       isolated=st.integers(0, 3), unit=st.booleans(), engine=st.sampled_from(MERGE_ENGINES))
def test_greedy_properties(seed: int, n: int, density: float, isolated: int, unit: bool, engine: str):
    adj = random_graph(seed, n + isolated, density, isolated)
    if unit:  # unit weights: many ties, still valid and deterministic
        adj.data[:] = 1.0
    tree = encoding_tree(adj, tol=1e-12, engine=engine)
    assert_valid_tree(tree, adj)
    assert tree.entropy_2d <= tree.entropy_1d + 1e-12
    assert tree.entropy_1d == pytest.approx(structural_entropy_1d(adj), abs=1e-12)
    assert tree.entropy_2d == pytest.approx(structural_entropy_2d(adj, tree.community), abs=1e-12)
    degree = adj.sum(axis=1)
    for v in np.flatnonzero(degree == 0):  # isolated nodes are singletons
        assert (tree.community == tree.community[v]).sum() == 1
    vol = float(degree.sum())
    if vol > 0:  # no adjacent pair left whose merge gains more than the tolerance
        volume, cut, between = stats(adj, tree.community)
        limit = 1e-12 * max(1.0, math.log2(vol)) + 1e-12
        for x, y in zip(*np.nonzero(np.triu(between, k=1))):
            assert merge_gain(volume[x], cut[x], volume[y], cut[y], between[x, y], vol) <= limit
    again = encoding_tree(adj, engine=engine)
    assert np.array_equal(again.community, tree.community)  # deterministic


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(2, 25), density=st.floats(0.1, 0.6), data=st.data())
def test_relabelling_permutes_the_result(seed: int, n: int, density: float, data: st.DataObject):
    adj = random_graph(seed, n, density)  # continuous weights: no ties
    perm = np.array(data.draw(st.permutations(list(range(n)))))
    moved = sp.csr_array(adj[perm][:, perm])  # node i of moved is node perm[i] of adj
    tree, other = encoding_tree(adj), encoding_tree(moved)
    assert other.entropy_2d == pytest.approx(tree.entropy_2d, abs=1e-12)
    assert other.n_merges == tree.n_merges
    same = tree.community[perm]  # the partition, seen in the moved numbering
    for x in range(tree.n_communities):
        assert len(set(other.community[same == x].tolist())) == 1
    assert np.allclose(np.sort(other.volume), np.sort(tree.volume))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(3, 14), n_labels=st.integers(2, 6), data=st.data())
def test_merge_gain_is_the_entropy_difference(seed: int, n: int, n_labels: int, data: st.DataObject):
    adj = random_graph(seed, n, 0.4)
    rng = np.random.default_rng(seed)
    labels = np.unique(rng.integers(0, n_labels, n), return_inverse=True)[1].astype(np.int64)
    c = int(labels.max()) + 1
    if c < 2:
        return
    x = data.draw(st.integers(0, c - 1))
    y = data.draw(st.integers(0, c - 1).filter(lambda v: v != x))
    volume, cut, between = stats(adj, labels)
    vol = float(volume.sum())
    merged = np.where(labels == y, x, labels)
    want = structural_entropy_2d(adj, labels) - structural_entropy_2d(adj, merged)
    got = merge_gain(volume[x], cut[x], volume[y], cut[y], between[x, y], vol)
    assert got == pytest.approx(want, abs=1e-12)
    if between[x, y] == 0:
        assert got <= 1e-12  # non-adjacent merges never help


# ---------------------------------------------------------------- the compiled merge against the interpreted one


def sparse_graph(seed: int, n: int, degree: float, integer: bool, hubs: int = 0) -> sp.csr_array:
    """A sparse random graph (mean degree ``degree``) with ``hubs`` nodes linked to a tenth of the others,
    and a few isolated nodes; integer weights make every cut sum exact in float64."""
    rng = np.random.default_rng(seed)
    m = int(n * degree / 2)
    rows, cols = rng.integers(0, n - 3, m), rng.integers(0, n - 3, m)
    for h in range(hubs):
        spokes = rng.choice(n - 3, size=max(1, n // 10), replace=False)
        rows, cols = np.concatenate([rows, np.full(spokes.size, h)]), np.concatenate([cols, spokes])
    weights = rng.integers(1, 6, rows.size).astype(np.float64) if integer else rng.uniform(0.05, 1.0, rows.size)
    upper = sp.coo_array((weights, (np.minimum(rows, cols), np.maximum(rows, cols))), shape=(n, n)).tocsr()
    upper = sp.triu(upper, k=1)
    return sp.csr_array(upper + upper.T)


@pytest.mark.parametrize("seed,n,degree,hubs", [(0, 50, 3.0, 0), (1, 400, 6.0, 2), (2, 2000, 10.0, 5),
                                                 (3, 3000, 2.0, 0), (4, 1500, 25.0, 1)])
def test_compiled_merge_is_the_interpreted_one(seed: int, n: int, degree: float, hubs: int):
    """Integer weights (exact sums): the same steps give the same tree. Real weights: the compiled merge may
    add one community's cuts in another order, so the trees agree up to rounding."""
    exact = sparse_graph(seed, n, degree, integer=True, hubs=hubs)
    python, compiled = encoding_tree(exact, engine="python"), encoding_tree(exact, engine="compiled")
    assert np.array_equal(compiled.community, python.community)
    assert compiled.entropy_2d == python.entropy_2d and compiled.n_merges == python.n_merges > 0
    real = sparse_graph(seed, n, degree, integer=False, hubs=hubs)
    python, compiled = encoding_tree(real, engine="python"), encoding_tree(real, engine="compiled")
    assert compiled.entropy_2d == pytest.approx(python.entropy_2d, abs=1e-9)
    assert_valid_tree(compiled, real)


def test_unknown_engine_raises():
    with pytest.raises(ValueError, match="engine must be one of"):
        encoding_tree(graph(TWO_TRIANGLES, 6), engine="fast")


# ---------------------------------------------------------------- inputs


def test_isolated_nodes_are_singletons():
    adj = graph([(1, 2), (2, 3), (1, 3), (5, 6), (6, 7), (5, 7)], 9)  # nodes 0, 4 and 8 have no edge
    tree = encoding_tree(adj)
    assert tree.community.tolist() == [0, 1, 1, 1, 2, 3, 3, 3, 4]
    assert tree.volume.tolist() == [0.0, 6.0, 0.0, 6.0, 0.0]
    assert tree.entropy_2d == pytest.approx(math.log2(3), abs=1e-12)
    empty = encoding_tree(sp.csr_array((4, 4)))
    assert empty.community.tolist() == [0, 1, 2, 3] and empty.entropy_1d == 0.0 == empty.entropy_2d
    assert encoding_tree(sp.csr_array((0, 0))).community.shape == (0,)


def test_negative_weights_asymmetry_and_shape_raise():
    adj = graph(TWO_TRIANGLES, 6).tolil()
    adj[0, 1] = adj[1, 0] = -0.5
    with pytest.raises(ValueError, match="negative"):
        encoding_tree(sp.csr_array(adj))
    with pytest.raises(ValueError, match="negative"):
        structural_entropy_1d(sp.csr_array(adj))
    lopsided = graph(TWO_TRIANGLES, 6).tolil()
    lopsided[0, 1] = 2.0
    with pytest.raises(ValueError, match="not symmetric"):
        encoding_tree(sp.csr_array(lopsided))
    with pytest.raises(ValueError, match="square"):
        encoding_tree(sp.csr_array(np.ones((2, 3))))
    with pytest.raises(ValueError, match="NaN"):
        encoding_tree(sp.csr_array(np.array([[0.0, np.nan], [np.nan, 0.0]])))


def test_self_loops_are_dropped():
    adj = graph(TWO_TRIANGLES + [(2, 3)], 6)
    looped = adj + sp.eye_array(6) * 1.0  # eq. (3)-(5) at i = j put a weight-1 loop on every node
    assert symmetric_weights(looped).diagonal().sum() == 0.0
    for f in (structural_entropy_1d, lambda a: encoding_tree(a).entropy_2d):
        assert f(looped) == f(adj)
    assert np.array_equal(encoding_tree(looped).community, encoding_tree(adj).community)


def test_rounding_asymmetry_is_averaged():
    adj = random_graph(3, 12, 0.5).tolil()
    adj[0, 1] = adj[0, 1] * (1 + 1e-15)
    w = symmetric_weights(sp.csr_array(adj))
    assert abs(w - w.T).max() == 0.0
