"""SeRAG's graph under a growing corpus: only rows involving new chunks are computed, and the result
matches a full build wherever the issue says it must (logical and distance layers everywhere, the
semantic layer on every pair involving a new chunk); old-old semantic entries keep their stored values."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from tasks.methods.serag import algorithm as se

P = se.GraphParams(k_sem=5, max_entity_chunks=6)


def corpus(seed: int, n_docs: int = 30, m: int = 40):
    """Chunks of documents (1–4 each): ids, embeddings, incidence, entity names, document, position."""
    rng = np.random.default_rng(seed)
    ids, doc, pos = [], [], []
    for d in range(n_docs):
        for i in range(int(rng.integers(1, 5))):
            ids.append(f"d{d}:{i}")
            doc.append(d)
            pos.append(i)
    n = len(ids)
    x = rng.normal(size=(n, 12))
    emb = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    popular = rng.random((n, m)) < np.linspace(0.25, 0.01, m)  # entity 0 is in ~25% of chunks: over the cap
    inc = sp.csr_array(popular.astype(np.float64) * rng.integers(1, 3, size=(n, m)))
    names = np.array([f"e{j}" for j in range(m)], dtype=object)
    return np.array(ids, dtype=object), emb, inc, names, np.array(doc), np.array(pos)


def subset(c, rows):
    ids, emb, inc, names, doc, pos = c
    return ids[rows], emb[rows], inc[rows], names, doc[rows], pos[rows]


def pairs(m: sp.sparray, keep) -> dict[tuple[int, int], float]:
    c = sp.coo_array(m)
    return {(int(i), int(j)): float(v) for i, j, v in zip(c.row, c.col, c.data) if keep(int(i), int(j))}


def test_growth_matches_full_build_on_new_rows_and_keeps_old_ones():
    full = corpus(0)
    ids, doc = full[0], full[4]
    old_docs = set(range(30)) - {3, 11, 17, 25, 29}
    old_rows = np.flatnonzero([d in old_docs for d in doc])
    old = se.build_layers(*subset(full, old_rows), P)
    perm = np.random.default_rng(1).permutation(len(ids))  # the current corpus in another row order
    cur = subset(full, perm)
    grown, report = se.grow_layers(old, *cur, P)
    ref = se.build_layers(*cur, P)
    is_new = ~np.isin(cur[0], old.ids)
    assert report.added == is_new.sum() and report.removed == 0 and report.rows_computed == is_new.sum()
    assert report.rows_total == len(ids) and report.log_rows_refreshed > 0  # entities crossed the cap of 6
    for layer in ("log", "dist"):  # exactly a full build's
        a, b = getattr(grown, layer), getattr(ref, layer)
        assert (a != b).nnz == 0 or np.allclose((a - b).toarray(), 0, atol=1e-12)
    assert ref.dist.nnz > 0 and ref.log.nnz > 0
    def involving_new(i: int, j: int) -> bool:
        return bool(is_new[i] or is_new[j])

    g, r = pairs(grown.sem, involving_new), pairs(ref.sem, involving_new)
    assert g.keys() == r.keys() and len(g) > 0
    assert all(abs(g[key] - r[key]) < 1e-6 for key in g)
    # old-old semantic entries are the stored ones, moved to the current row order
    back = {cid: i for i, cid in enumerate(old.ids)}
    stored = pairs(old.sem, lambda i, j: True)
    carried = pairs(grown.sem, lambda i, j: not involving_new(i, j))
    assert carried == {(i, j): stored[back[cur[0][i]], back[cur[0][j]]] for (i, j) in carried}
    assert len(carried) == len(stored)
    w, sizes = se.layers_graph(grown, P)
    assert (w != w.T).nnz == 0 and w.diagonal().max() == 0 and sizes["sem_nnz"] == grown.sem.nnz
    assert grown.entity_df == ref.entity_df


def test_removed_chunks_are_dropped_and_nothing_new_is_computed():
    full = corpus(2)
    old = se.build_layers(*full, P)
    keep = np.flatnonzero(~np.isin(full[4], [0, 5, 9]))
    cur = subset(full, keep)
    grown, report = se.grow_layers(old, *cur, P)
    assert report.added == 0 and report.rows_computed == 0 and report.removed == len(full[0]) - len(keep)
    n = len(keep)
    assert grown.sem.shape == (n, n)
    np.testing.assert_array_equal(grown.dist.toarray(), old.dist[keep][:, keep].toarray())
    np.testing.assert_array_equal(grown.sem.toarray(), old.sem[keep][:, keep].toarray())
    ref = se.build_layers(*cur, P)  # the logical layer follows the cap even after removals
    np.testing.assert_allclose(grown.log.toarray(), ref.log.toarray(), atol=1e-12)


def test_full_build_layers_give_the_full_graph_and_growth_appends_rows():
    full = corpus(3)
    first = se.build_layers(*full, P)
    w, sizes = se.layers_graph(first, P)
    w0, sizes0 = se.multi_perspective_graph(full[1], full[2], full[4], full[5], P)
    assert sizes == sizes0 and abs(w - w0).max() == 0
    more = corpus(4, n_docs=3)
    more = (np.array([f"x{i}" for i in more[0]], dtype=object), *more[1:4], more[4] + 100, more[5])
    cur = (np.concatenate([full[0], more[0]]), np.vstack([full[1], more[1]]), sp.vstack([full[2], more[2]]).tocsr(),
           full[3], np.concatenate([full[4], more[4]]), np.concatenate([full[5], more[5]]))
    grown, report = se.grow_layers(first, *cur, P)
    assert report.added == len(more[0]) and report.kept == len(full[0])
    assert abs(grown.sem[:len(full[0])][:, :len(full[0])] - first.sem).max() == 0  # old block untouched
