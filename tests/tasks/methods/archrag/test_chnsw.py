"""C-HNSW (ArchRAG §3.1.3, Alg. 2): recall, batching, exact mode, links, persistence, edge cases."""
from __future__ import annotations

import faiss
import numpy as np
import pytest

from tasks.methods.archrag.chnsw import CHNSW, CHNSWParams, inter_layer_links, normalise

D = 64


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _hierarchy(seed: int = 0, sizes=(5000, 400, 40), noise=(0.5, 0.7)) -> list[np.ndarray]:
    """Top layer random unit vectors; each lower node = a random node above + noise (a clustered tree)."""
    rng = np.random.default_rng(seed)
    layers = [_unit(rng.standard_normal((sizes[-1], D)))]
    for n, sd in zip(reversed(sizes[:-1]), reversed(noise)):
        parent = rng.integers(0, len(layers[0]), n)
        layers.insert(0, _unit(layers[0][parent] + sd * rng.standard_normal((n, D)) / np.sqrt(D) * 4))
    return layers


def _queries(layers: list[np.ndarray], n: int = 200, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = layers[0][rng.integers(0, len(layers[0]), n)]
    return _unit(base + 0.3 * rng.standard_normal((n, D)).astype(np.float32) / np.sqrt(D) * 4)


def _brute(x: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(normalise(q) @ normalise(x).T), axis=1, kind="stable")[:, :k]


@pytest.fixture(scope="module")
def built():
    layers = _hierarchy()
    return layers, CHNSW.build(layers, CHNSWParams()), _queries(layers)


def test_structure_and_defaults(built):
    _layers, index, _ = built
    assert CHNSWParams() == CHNSWParams(M=32, ef_construction=100, ef_search=100, exact=False)  # §B.3
    assert index.sizes == [5000, 400, 40]
    # large layers are real HNSW graphs (IP metric); the 40-node top layer is kept flat (<= 2M nodes)
    for level in (0, 1):
        ix = index.indexes[level]
        assert isinstance(ix, faiss.IndexHNSWFlat)
        assert ix.metric_type == faiss.METRIC_INNER_PRODUCT
        assert ix.hnsw.efConstruction == 100
    assert not isinstance(index.indexes[2], faiss.IndexHNSW)
    assert index.inter[0].size == 0
    assert [len(x) for x in index.inter[1:]] == [400, 40]


def test_recall_at_default_ef(built):
    layers, index, q = built
    k = 5
    res = index.search(q, k)
    for level, x in enumerate(layers):
        truth = _brute(x, q, k)
        ids = res[level][0]
        recall = np.mean([len(set(a) & set(b)) / k for a, b in zip(ids, truth)])
        assert recall >= 0.95, (level, recall)


def test_sims_are_inner_products_sorted(built):
    layers, index, q = built
    res = index.search(q, 7)
    for level, (ids, sims) in enumerate(res):
        assert ids.dtype == np.int64 and sims.dtype == np.float32 and ids.shape == (len(q), 7)
        expect = np.einsum("bd,bkd->bk", q, layers[level][ids])
        np.testing.assert_allclose(sims, expect, atol=1e-5)
        assert (np.diff(sims, axis=1) <= 1e-6).all()


def test_batched_equals_one_at_a_time(built):
    _, index, q = built
    batch = index.search(q[:40], [6, 4, 3], ef_search=20)
    for i in range(40):
        one = index.search(q[i:i + 1], [6, 4, 3], ef_search=20)
        for level in range(3):
            np.testing.assert_array_equal(one[level][0][0], batch[level][0][i])
            np.testing.assert_array_equal(one[level][1][0], batch[level][1][i])


def test_exact_mode_equals_numpy(built):
    layers, index, q = built
    res = index.search(q, 5, exact=True)
    for level, x in enumerate(layers):
        np.testing.assert_array_equal(res[level][0], _brute(x, q, 5))
        np.testing.assert_allclose(res[level][1], np.sort(q @ x.T, axis=1)[:, ::-1][:, :5], atol=1e-5)


def test_exact_build_is_flat_and_exact():
    layers = _hierarchy(seed=3, sizes=(600, 80, 10))
    index = CHNSW.build(layers, CHNSWParams(exact=True))
    assert not any(isinstance(ix, faiss.IndexHNSW) for ix in index.indexes)
    q = _queries(layers, 30)
    res = index.search(q, 4)  # exact taken from the build params
    for level, x in enumerate(layers):
        np.testing.assert_array_equal(res[level][0], _brute(x, q, 4))


def test_inter_links_are_nearest_below(built):
    layers, index, _ = built
    for level in (1, 2):
        truth = np.argmax(layers[level] @ layers[level - 1].T, axis=1)
        np.testing.assert_array_equal(index.inter[level], truth)
    np.testing.assert_array_equal(inter_layer_links(layers[1], layers[0]), index.inter[1])


def test_descent_never_worse_than_entry(built):
    """Alg. 2 lines 6-7: layer i's best hit is at least as close as psi(best hit at layer i+1)."""
    layers, index, q = built
    res = index.search(q, 3, ef_search=1)
    for level in (0, 1):
        entry = index.inter[level + 1][res[level + 1][0][:, 0]]
        entry_sim = np.einsum("bd,bd->b", q, layers[level][entry])
        assert (res[level][1][:, 0] >= entry_sim - 1e-6).all()


def test_descent_uses_links(built, monkeypatch):
    """The lower layers start from psi(nearest hit above): corrupt the links and the entry points move."""
    _, index, q = built
    seen = []
    original = CHNSW._search_from

    def spy(self, level, qq, entry, k, ef):
        seen.append((level, np.array(entry)))
        return original(self, level, qq, entry, k, ef)

    monkeypatch.setattr(CHNSW, "_search_from", spy)
    res = index.search(q[:10], 2)
    assert [lv for lv, _ in seen] == [1, 0]
    np.testing.assert_array_equal(seen[0][1], index.inter[2][res[2][0][:, 0]])
    np.testing.assert_array_equal(seen[1][1], index.inter[1][res[1][0][:, 0]])


def test_layers_subset_and_per_layer_k(built):
    _, index, q = built
    full = index.search(q[:20], [5, 3, 2])
    only0 = index.search(q[:20], [5, 3, 2], layers=[0])
    np.testing.assert_array_equal(only0[0][0], full[0][0])
    assert only0[1][0].shape == (20, 0) and only0[2][1].shape == (20, 0)
    top = index.search(q[:20], [5, 3, 2], layers=[2])
    np.testing.assert_array_equal(top[2][0], full[2][0])
    assert top[0][0].shape == (20, 0)
    # k = 0 on an intermediate layer: empty there, the descent still goes through it
    skip = index.search(q[:20], [5, 0, 2])
    assert skip[1][0].shape == (20, 0)
    np.testing.assert_array_equal(skip[0][0], full[0][0])
    with pytest.raises(ValueError):
        index.search(q[:2], [5, 3])
    with pytest.raises(ValueError):
        index.search(q[:2], 5, layers=[3])


def test_round_trip_bytes(built):
    _, index, q = built
    blob = index.to_bytes()
    assert isinstance(blob, bytes)
    back = CHNSW.from_bytes(blob)
    assert back.sizes == index.sizes and back.params == index.params
    for a, b in zip(back.inter, index.inter):
        np.testing.assert_array_equal(a, b)
    r1, r2 = index.search(q, 5), back.search(q, 5)
    for (i1, s1), (i2, s2) in zip(r1, r2):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(s1, s2)
    assert back.to_bytes() == blob


def test_deterministic_build():
    layers = _hierarchy(seed=5, sizes=(800, 100, 8))
    assert CHNSW.build(layers, CHNSWParams(M=8)).to_bytes() == CHNSW.build(layers, CHNSWParams(M=8)).to_bytes()


def test_single_node_layer_and_padding():
    layers = _hierarchy(seed=2, sizes=(500, 70, 1))
    index = CHNSW.build(layers, CHNSWParams(M=16))
    assert index.sizes == [500, 70, 1]
    np.testing.assert_array_equal(index.inter[2], [np.argmax(layers[1] @ layers[2][0])])
    q = _queries(layers, 15)
    for exact in (False, True):
        res = index.search(q, [5, 5, 3], exact=exact)
        ids, sims = res[2]
        assert (ids[:, 0] == 0).all() and (ids[:, 1:] == -1).all()
        assert np.isneginf(sims[:, 1:]).all() and np.isfinite(sims[:, 0]).all()
        assert (res[0][0] >= 0).all()


def test_k_larger_than_layer_pads():
    layers = _hierarchy(seed=4, sizes=(300, 20, 4))
    index = CHNSW.build(layers, CHNSWParams(M=4))  # M=4: the 20-node layer is an HNSW graph
    assert isinstance(index.indexes[1], faiss.IndexHNSW)
    q = _queries(layers, 10)
    res = index.search(q, 25)
    ids, sims = res[2]
    assert (ids[:, 4:] == -1).all() and np.isneginf(sims[:, 4:]).all()
    assert (np.sort(ids[:, :4], axis=1) == np.arange(4)).all()
    ids1 = res[1][0]
    assert (ids1[:, 20:] == -1).all()
    assert (np.sort(ids1[:, :20], axis=1) == np.arange(20)).all()  # all 20 found, each once


def test_single_layer_entities_only():
    rng = np.random.default_rng(7)
    x = _unit(rng.standard_normal((1000, 32)))
    index = CHNSW.build([x], CHNSWParams())
    assert index.sizes == [1000] and len(index.inter) == 1
    q = _unit(rng.standard_normal((50, 32)))
    (ids, _sims), = index.search(q, 5)
    truth = _brute(x, q, 5)
    assert np.mean([len(set(a) & set(b)) / 5 for a, b in zip(ids, truth)]) >= 0.95
    (eids, _), = index.search(q, 5, exact=True)
    np.testing.assert_array_equal(eids, truth)


def test_normalises_inputs_and_queries():
    layers = _hierarchy(seed=6, sizes=(400, 30))
    scaled = [x * np.random.default_rng(0).uniform(0.1, 10, (len(x), 1)).astype(np.float32) for x in layers]
    q = _queries(layers, 20)
    a = CHNSW.build(layers, CHNSWParams(M=8)).search(q, 4)
    b = CHNSW.build(scaled, CHNSWParams(M=8)).search(q * 3.0, 4)
    for (ia, sa), (ib, sb) in zip(a, b):
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_allclose(sa, sb, atol=1e-5)


def test_bad_inputs():
    with pytest.raises(ValueError):
        CHNSW.build([], CHNSWParams())
    with pytest.raises(ValueError):
        CHNSW.build([np.ones((5, 8), np.float32), np.ones((2, 4), np.float32)], CHNSWParams())
    with pytest.raises(ValueError):
        CHNSW.build([np.ones((5, 8), np.float32), np.ones((0, 8), np.float32)], CHNSWParams())


def test_sanity_against_base_hnsw(built):
    """No timings: entering layer 0 through the links is about as accurate as a plain per-layer HNSW
    search (the paper's Base-HNSW, §4 / §B.3) at the same small ef, and both improve with ef."""
    layers, index, q = built
    truth = _brute(layers[0], q, 5)

    def recall(ids):
        return np.mean([len(set(a) & set(b)) / 5 for a, b in zip(ids, truth)])

    ours = {ef: recall(index.search(q, 5, layers=[0], ef_search=ef)[0][0]) for ef in (8, 100)}
    _, base = index.indexes[0].search(q, 5, params=faiss.SearchParametersHNSW(efSearch=8))
    assert ours[8] >= recall(base) - 0.05
    assert ours[100] > ours[8]
