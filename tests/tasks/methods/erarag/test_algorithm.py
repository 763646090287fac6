"""Tests for tasks/methods/erarag/algorithm.py: LSH codes, segment bounds and locality, hierarchy structure,
incremental insert / delete against full rebuilds, collapsed and biased search oracles."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.llm.summarize import SummaryRequest, extractive_summariser
from tasks.methods.erarag.algorithm import (
    EraRAGParams,
    Hierarchy,
    biased_search,
    build,
    build_hierarchy,
    collapsed_search,
    delete,
    feasible_size,
    hyperplanes,
    insert,
    lsh_codes,
    local_segments,
    lsh_segments,
    replace_leaves,
    search,
    whitespace_tokens,
)
from tasks.text.sentences import split_sentences

P = EraRAGParams()
R = EraRAGParams(update_segmenting="rebuild")  # updates re-cut every layer: equal to a build


# ---------------------------------------------------------------- fixtures / helpers


def fake_summarise(requests: list[SummaryRequest]) -> tuple[list[str], np.ndarray]:
    """Summary = child ids joined; embedding = normalised mean of the child embeddings."""
    texts = ["+".join(r.child_ids) for r in requests]
    means = np.stack([r.child_emb.mean(axis=0) for r in requests])
    return texts, means / np.linalg.norm(means, axis=1, keepdims=True)


def corpus(n: int, d: int = 32, topics: int = 40, noise: float = 0.5, seed: int = 0):
    """Topic-clustered unit vectors, rows sorted by topic; ids 'c00000'..."""
    rng = np.random.default_rng(seed)
    labels = np.sort(rng.integers(0, topics, n))
    x = rng.standard_normal((topics, d))[labels] + noise * rng.standard_normal((n, d))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    return np.array([f"c{i:05d}" for i in range(n)], dtype=object), x


def as_sets(ids: np.ndarray, segments: list[np.ndarray]) -> set[frozenset]:
    """Segments as a set of id sets (order-free comparison)."""
    return {frozenset(ids[s]) for s in segments}


def same_graph(a: Hierarchy, b: Hierarchy) -> bool:
    """Identical node tables and embeddings."""
    return a.nodes.equals(b.nodes) and np.array_equal(a.embeddings, b.embeddings)


@pytest.fixture(scope="module")
def data():
    ids, x = corpus(2000)
    planes = hyperplanes(x.shape[1], P.n_hyperplanes, P.seed)
    return ids, x, planes, build_hierarchy(ids, x, fake_summarise, planes, P)


# ---------------------------------------------------------------- LSH


def test_hyperplanes_seeded():
    a, b, c = hyperplanes(16, 20, 0), hyperplanes(16, 20, 0), hyperplanes(16, 20, 1)
    assert a.shape == (20, 16) and a.dtype == np.float32
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_lsh_codes_are_packed_sign_bits():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((50, 16)).astype(np.float32)
    planes = hyperplanes(16, 20, 0)
    codes = lsh_codes(x, planes)
    assert codes.dtype == np.uint64 and np.all(codes < 2**20)
    bits = (x.astype(np.float64) @ planes.T.astype(np.float64)) > 0
    expected = [int("".join("1" if b else "0" for b in row), 2) for row in bits]  # plane 0 = MSB
    assert codes.tolist() == expected
    assert np.array_equal(codes, lsh_codes(x, hyperplanes(16, 20, 0)))
    assert not np.array_equal(codes, lsh_codes(x, hyperplanes(16, 20, 1)))
    # hashing one row alone gives the same code as in a batch
    assert all(lsh_codes(x[i:i + 1], planes)[0] == codes[i] for i in range(len(x)))


def test_segments_deterministic_and_seed_dependent(data):
    ids, x, planes, _ = data
    seg = lambda pl: as_sets(ids, lsh_segments(lsh_codes(x, pl), ids, P))  # noqa: E731
    assert seg(planes) == seg(hyperplanes(x.shape[1], 20, 0))
    assert seg(planes) != seg(hyperplanes(x.shape[1], 20, 1))


# ---------------------------------------------------------------- segmentation properties


@st.composite
def layer_and_params(draw):
    s_min = draw(st.integers(2, 10))
    s_max = draw(st.integers(s_min, 3 * s_min))
    s_avg = draw(st.integers(s_min, s_max))
    bits = draw(st.integers(1, 16))
    n = draw(st.integers(0, 400))
    alphabet = draw(st.integers(1, 2**bits))  # few distinct codes -> large buckets
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**bits, alphabet)[rng.integers(0, alphabet, n)].astype(np.uint64)
    params = EraRAGParams(n_hyperplanes=bits, segment_min=s_min, segment_avg=s_avg, segment_max=s_max)
    return codes, np.arange(n), params, rng


@settings(max_examples=150, deadline=None)
@given(layer_and_params())
def test_segments_partition_within_bounds(case):
    codes, ids, params, _ = case
    segs = lsh_segments(codes, ids, params)
    assert sorted(np.concatenate(segs).tolist() if segs else []) == list(range(len(codes)))
    sizes = np.array([len(s) for s in segs])
    if feasible_size(len(codes), params):
        assert sizes.min() >= params.segment_min and sizes.max() <= params.segment_max
    elif len(codes):  # documented exception: the whole layer cannot be cut within bounds
        assert len(segs) == max(1, int(len(codes) / params.segment_avg + 0.5))
        assert sizes.max() - sizes.min() <= 1


@settings(max_examples=100, deadline=None)
@given(layer_and_params())
def test_segments_depend_on_the_set_only(case):
    codes, ids, params, rng = case
    perm = rng.permutation(len(codes))
    assert as_sets(ids, lsh_segments(codes, ids, params)) == \
        as_sets(ids[perm], lsh_segments(codes[perm], ids[perm], params))


@settings(max_examples=150, deadline=None)
@given(layer_and_params(), st.integers(0, 2**16 - 1))
def test_one_new_item_changes_few_segments(case, new_code):
    """Locality: one insertion changes its bucket's segments plus <= 1 per trie level + root fix-up."""
    codes, ids, params, _ = case
    params = replace(params, segment_min=8, segment_avg=10, segment_max=12)
    new_code = np.uint64(new_code % 2**params.n_hyperplanes)
    before = as_sets(ids, lsh_segments(codes, ids, params))
    codes2, ids2 = np.append(codes, new_code), np.append(ids, len(ids))
    after = as_sets(ids2, lsh_segments(codes2, ids2, params))
    bucket = int((codes2 == new_code).sum())
    assert len(before - after) <= bucket // params.segment_min + 1 + params.n_hyperplanes + 3


# ---------------------------------------------------------------- hierarchy (Alg. 1)


def check_structure(h: Hierarchy, params: EraRAGParams) -> None:
    """Every leaf has exactly one ancestor chain to the top; counts and stopping rule hold."""
    nodes = h.nodes
    assert nodes["node_id"].is_unique and len(h.embeddings) == len(nodes)
    top = h.n_layers - 1
    layer_of = dict(zip(nodes["node_id"], nodes["layer"]))
    parent_of = dict(zip(nodes["node_id"], nodes["parent_id"]))
    for nid in nodes.loc[nodes["layer"] == 0, "node_id"]:
        chain = [nid]
        while not pd.isna(parent_of[chain[-1]]):
            chain.append(parent_of[chain[-1]])
        assert [layer_of[c] for c in chain] == list(range(top + 1))
    kids = nodes["parent_id"].dropna().value_counts()
    summaries = nodes[nodes["layer"] > 0]
    assert (kids.reindex(summaries["node_id"]).to_numpy() == summaries["n_children"].to_numpy()).all()
    n_top = int((nodes["layer"] == top).sum())
    assert n_top <= params.stop_size or top == params.max_layers
    for l in range(top):  # each layer below the top was worth summarising
        assert int((nodes["layer"] == l).sum()) > params.stop_size


def test_build_structure(data):
    ids, x, planes, h = data
    check_structure(h, P)
    assert h.n_layers >= 3
    assert list(h.nodes.columns) == ["node_id", "layer", "text", "parent_id", "code", "n_children"]
    summaries = h.nodes[h.nodes["layer"] > 0]
    assert summaries["node_id"].str.match(r"L\d+-[0-9a-f]{16}$").all()
    assert np.array_equal(h.nodes["code"].to_numpy(np.uint64), lsh_codes(h.embeddings, planes))
    assert same_graph(h, build_hierarchy(ids, x, fake_summarise, planes, P))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 400), st.integers(1, 4), st.integers(0, 1000))
def test_every_leaf_has_one_chain_to_the_top(n, max_layers, seed):
    ids, x = corpus(n, d=16, topics=8, seed=seed)
    params = EraRAGParams(max_layers=max_layers)
    h = build_hierarchy(ids, x.reshape(n, 16), fake_summarise, hyperplanes(16, 20, seed), params)
    assert int((h.nodes["layer"] == 0).sum()) == n
    if n:
        check_structure(h, params)


# ---------------------------------------------------------------- updates (Alg. 3, deletion)


def test_insert_last_tenth_equals_full_build(data):
    ids, x, planes, full = data
    cut = int(0.9 * len(ids))
    base = build_hierarchy(ids[:cut], x[:cut], fake_summarise, planes, P)
    grown, report = insert(base, ids[cut:], x[cut:], fake_summarise, planes, R)
    assert same_graph(grown, full)
    rows = report.layers.set_index("layer")
    assert rows.loc[0, "nodes_added"] == len(ids) - cut and rows.loc[0, "nodes_removed"] == 0
    assert (rows.loc[1:, "segments_resummarised"] == rows.loc[1:, "nodes_added"]).all()
    n_full = int((full.nodes["layer"] > 0).sum())
    print(f"\ninsert last 10% (new topics): re-summarised {report.resummarised} of {n_full} "
          f"segments a full rebuild summarises\n{report.layers.to_string(index=False)}")
    assert report.resummarised < 0.5 * n_full
    # untouched nodes keep id, text, embedding, code
    kept = base.nodes.merge(grown.nodes, on=["node_id", "layer"], suffixes=("_old", "_new"))
    assert (kept["text_old"] == kept["text_new"]).all() and (kept["code_old"] == kept["code_new"]).all()
    old_row = dict(zip(base.nodes["node_id"], range(len(base.nodes))))
    new_row = dict(zip(grown.nodes["node_id"], range(len(grown.nodes))))
    assert all(np.array_equal(base.embeddings[old_row[n]], grown.embeddings[new_row[n]])
               for n in kept["node_id"])
    # the segments the new leaves land in are new nodes, and their ancestors too
    parent = dict(zip(grown.nodes["node_id"], grown.nodes["parent_id"]))
    for nid in ids[cut:]:
        p = parent[nid]
        while not pd.isna(p):
            assert p not in old_row
            p = parent[p]


def held_out(data, share: float):
    """(a build of a random 1 - share of the leaves, the held-out ids, their embeddings)."""
    ids, x, planes, _ = data
    perm = np.random.default_rng(5).permutation(len(ids))
    cut = int((1 - share) * len(ids))
    return build_hierarchy(ids[perm[:cut]], x[perm[:cut]], fake_summarise, planes, P), ids[perm[cut:]], x[perm[cut:]]


def test_insert_random_tenth(data):
    ids, x, planes, full = data
    base, new_ids, new_x = held_out(data, 0.1)
    grown, report = insert(base, new_ids, new_x, fake_summarise, planes, R)
    assert same_graph(grown, full)
    leaves = grown.nodes[grown.nodes["layer"] == 0]
    direct = leaves.loc[leaves["node_id"].isin(set(new_ids)), "parent_id"].nunique()
    n_full = int((full.nodes["layer"] > 0).sum())
    print(f"\ninsert random 10%: re-summarised {report.resummarised} of {n_full}; layer 1: "
          f"{int(report.layers.loc[1, 'segments_resummarised'])} of {int(report.layers.loc[1, 'n_nodes'])}, "
          f"{direct} of them hold a new leaf")
    assert report.resummarised < n_full


def test_single_insert_is_local(data):
    ids, x, planes, full = data
    rng = np.random.default_rng(7)
    for i in rng.choice(len(ids), 10, replace=False):
        keep = np.arange(len(ids)) != i
        base = build_hierarchy(ids[keep], x[keep], fake_summarise, planes, P)
        grown, report = insert(base, [ids[i]], x[[i]], fake_summarise, planes, R)
        assert same_graph(grown, full)
        per_layer = report.layers["segments_resummarised"].to_numpy()[1:]
        assert per_layer[0] <= P.n_hyperplanes + 3  # own segment + <= 1 per trie level + root
        assert report.resummarised < 0.2 * int((full.nodes["layer"] > 0).sum())


def test_delete_then_reinsert_is_identity(data):
    ids, x, planes, full = data
    removed = np.random.default_rng(11).choice(len(ids), 150, replace=False)
    shrunk, report = delete(full, ids[removed], fake_summarise, planes, R)
    check_structure(shrunk, P)
    assert int(report.layers.loc[0, "nodes_removed"]) == 150
    keep = np.setdiff1d(np.arange(len(ids)), removed)
    assert same_graph(shrunk, build_hierarchy(ids[keep], x[keep], fake_summarise, planes, P))
    back, _ = insert(shrunk, ids[removed], x[removed], fake_summarise, planes, R)
    assert same_graph(back, full)


def test_replace_leaves_is_one_pass_of_delete_and_insert(data):
    ids, x, planes, _ = data
    rng = np.random.default_rng(12)
    start = rng.choice(len(ids), 1800, replace=False)
    base = build_hierarchy(ids[start], x[start], fake_summarise, planes, P)
    removed = rng.choice(start, 60, replace=False)
    added = np.setdiff1d(np.arange(len(ids)), start)
    final = np.concatenate([np.setdiff1d(start, removed), added])
    edited, report = replace_leaves(base, ids[removed], ids[added], x[added], fake_summarise, planes, R)
    rebuilt, build_report = build(ids[final], x[final], fake_summarise, planes, P)
    assert same_graph(edited, rebuilt) and build_report.resummarised == build_report.segments_total
    two_pass = delete(base, ids[removed], fake_summarise, planes, R)[1].resummarised + \
        insert(delete(base, ids[removed], fake_summarise, planes, R)[0], ids[added], x[added], fake_summarise,
               planes, R)[1].resummarised
    assert 0 < report.resummarised <= two_pass and report.resummarised < report.segments_total
    assert report.layers.loc[0, "nodes_added"] == 200 and report.layers.loc[0, "nodes_removed"] == 60
    same, none = replace_leaves(base, [], [], np.zeros((0, x.shape[1])), fake_summarise, planes, R)
    assert same_graph(same, base) and none.resummarised == 0


def test_update_errors_and_edge_cases(data):
    ids, x, planes, full = data
    with pytest.raises(ValueError):
        insert(full, ids[:1], x[:1], fake_summarise, planes, P)
    with pytest.raises(KeyError):
        delete(full, ["nope"], fake_summarise, planes, P)
    empty, report = delete(full, ids, fake_summarise, planes, P)
    assert len(empty.nodes) == 0 and report.resummarised == 0
    again, _ = insert(empty, ids, x, fake_summarise, planes, P)
    assert same_graph(again, full)
    small = build_hierarchy(ids[:5], x[:5], fake_summarise, planes, P)
    assert small.n_layers == 1 and small.nodes["parent_id"].isna().all()


# ---------------------------------------------------------------- local updates (Alg. 3, the default)


@settings(max_examples=150, deadline=None)
@given(layer_and_params(), st.integers(0, 40))
def test_local_segments_keep_stored_segments(case, n_new):
    """Alg. 3 lines 2-8: a new item joins the segment of a kept item sharing its longest code prefix (or, where
    that segment overflowed, the repair's cut in code order may pass it to the next segment); every stored
    segment that gained nothing and stays in bounds keeps exactly its members; bounds hold."""
    codes, ids, params, rng = case
    n_new = min(n_new, len(codes))
    old = np.arange(len(codes) - n_new)
    stored = lsh_segments(codes[old], ids[old], params)
    label = np.full(len(codes), -1)
    for j, s in enumerate(stored):
        label[old[s]] = j
    segs = local_segments(codes, ids, label, params)
    assert sorted(np.concatenate(segs).tolist() if segs else []) == list(range(len(codes)))
    if feasible_size(len(codes), params) and len(old):
        sizes = [len(s) for s in segs]
        assert min(sizes) >= params.segment_min and max(sizes) <= params.segment_max
    after = as_sets(ids, segs)
    new = frozenset(ids[len(old):].tolist())
    kept = {frozenset(ids[old[s]].tolist()) for s in stored}
    if all(g - new in kept for g in after) and len(old):  # no segment was re-cut
        assert {g - new for g in after} == kept  # every stored segment survives, grown by new items only
        prefix = lambda a, b: params.n_hyperplanes - (int(a) ^ int(b)).bit_length()  # noqa: E731
        home = {int(i): n for n, seg in enumerate(segs) for i in seg}  # position -> its segment, in code order
        for i in range(len(old), len(codes)):  # it joined a segment holding its longest-prefix kept item ...
            best = max(prefix(codes[i], codes[j]) for j in old)
            holds = [any(prefix(codes[i], codes[j]) == best for j in seg if j < len(old)) for seg in segs]
            n = home[i]
            # ... or sits next to one that does: the segment it joined overflowed S_max and was merged with its
            # neighbour and cut again in code order, and the cut gave the old members their old segments back
            # (a tie of codes across the cut puts the new item, last among equal codes, on the far side)
            assert holds[n] or any(0 <= m < len(segs) and holds[m] for m in (n - 1, n + 1)), \
                (i, [codes[segs[m]].tolist() for m in range(len(segs))])


def test_local_single_insert_changes_one_segment_per_layer(data):
    """With the stored segments kept, one new leaf changes its own first-layer segment (two when that
    segment is re-cut past S_max), and the chain above it; rebuild mode may re-cut a whole trie path."""
    ids, x, planes, full = data
    for i in np.random.default_rng(7).choice(len(ids), 10, replace=False):
        keep = np.arange(len(ids)) != i
        base = build_hierarchy(ids[keep], x[keep], fake_summarise, planes, P)
        grown, report = insert(base, [ids[i]], x[[i]], fake_summarise, planes, P)
        check_structure(grown, P)
        first = int(report.layers.loc[1, "segments_resummarised"])
        assert 1 <= first <= 2
        sizes = grown.nodes.loc[grown.nodes["layer"] > 0, "n_children"]
        assert sizes.min() >= P.segment_min and sizes.max() <= P.segment_max


def test_local_update_is_cheaper_and_keeps_untouched_nodes(data):
    ids, x, planes, _ = data
    base, new_ids, new_x = held_out(data, 0.05)
    local, lrep = insert(base, new_ids, new_x, fake_summarise, planes, P)
    rebuilt, rrep = insert(base, new_ids, new_x, fake_summarise, planes, R)
    check_structure(local, P)
    assert lrep.resummarised <= rrep.resummarised
    assert lrep.layers.loc[1, "segments_resummarised"] < rrep.layers.loc[1, "segments_resummarised"]
    print(f"\ninsert random 5%: local {lrep.resummarised}, rebuild {rrep.resummarised} segments summarised")
    # a first-layer segment with no new leaf is kept unless a re-cut past S_max pooled it
    new = set(new_ids)
    nodes = local.nodes
    leaves = nodes[nodes["layer"] == 0]
    touched = set(leaves.loc[leaves["node_id"].isin(new), "parent_id"])
    old1 = set(base.nodes.loc[base.nodes["layer"] == 1, "node_id"])
    fresh1 = set(nodes.loc[nodes["layer"] == 1, "node_id"]) - old1
    assert len(fresh1 - touched) <= len(fresh1 & touched) // 4  # re-cuts pool a neighbour now and then
    # nothing changed: the same graph, nothing summarised
    same, none = replace_leaves(local, [], [], np.zeros((0, x.shape[1])), fake_summarise, planes, P)
    assert same_graph(same, local) and none.resummarised == 0


def test_local_delete_keeps_bounds_and_chains(data):
    ids, x, planes, full = data
    removed = np.random.default_rng(11).choice(len(ids), 150, replace=False)
    shrunk, report = delete(full, ids[removed], fake_summarise, planes, P)
    check_structure(shrunk, P)
    sizes = shrunk.nodes.loc[shrunk.nodes["layer"] > 0, "n_children"]
    assert sizes.min() >= P.segment_min and sizes.max() <= P.segment_max
    assert int(report.layers.loc[0, "nodes_removed"]) == 150
    assert report.resummarised < int((full.nodes["layer"] > 0).sum())


def test_update_segmenting_is_validated():
    with pytest.raises(ValueError, match="update_segmenting"):
        EraRAGParams(update_segmenting="nope")


# ---------------------------------------------------------------- retrieval (Alg. 2, III-D)


@pytest.fixture(scope="module")
def nodes():
    rng = np.random.default_rng(2)
    emb = rng.standard_normal((600, 24)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    queries = rng.standard_normal((20, 24)).astype(np.float32)
    tokens = rng.integers(20, 200, 600)
    layer = np.where(rng.random(600) < 0.8, 0, rng.integers(1, 4, 600))
    return queries, emb, tokens, layer


def test_collapsed_search_matches_brute_force(nodes):
    queries, emb, tokens, layer = nodes
    params = replace(P, top_k=15, token_budget=10**9)
    res = collapsed_search(queries, emb, tokens, layer, params)
    brute = np.argsort(-(queries @ emb.T), axis=1, kind="stable")[:, :15]
    assert np.array_equal(res.indices, brute)
    assert np.allclose(res.scores, np.take_along_axis(queries @ emb.T, brute, 1), atol=1e-5)


def test_flat_topk_is_an_index_search_without_the_index(nodes):
    """faiss.knn on the array returns what an IndexFlatIP over a copy of it returns, bit for bit (both
    batch paths: one query takes faiss's sequential scan, many take its BLAS one)."""
    import faiss

    from tasks.methods.erarag.algorithm import flat_topk
    queries, emb, _, _ = nodes
    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(emb)
    for q in (queries[:1], queries, np.repeat(queries, 3, axis=0)):
        for k in (1, 15, 600, 700):
            got_s, got_i = flat_topk(q, emb, k)
            ref_s, ref_i = index.search(q, min(k, len(emb)))
            assert np.array_equal(got_i[:, :ref_i.shape[1]], ref_i)
            assert np.array_equal(got_s[:, :ref_s.shape[1]], ref_s)
            assert (got_i[:, ref_i.shape[1]:] == -1).all() and np.isneginf(got_s[:, ref_s.shape[1]:]).all()


def test_rows_is_a_view_for_a_run_and_a_copy_otherwise():
    from tasks.methods.erarag.algorithm import _rows
    emb = np.arange(40, dtype=np.float32).reshape(10, 4)
    run, gaps = np.arange(3, 8), np.array([1, 2, 5])
    assert np.array_equal(_rows(emb, run), emb[run]) and np.shares_memory(_rows(emb, run), emb)
    assert np.array_equal(_rows(emb, gaps), emb[gaps]) and not np.shares_memory(_rows(emb, gaps), emb)
    assert _rows(emb, np.zeros(0, np.int64)).shape == (0, 4)


def test_token_budget_is_a_prefix_that_fits(nodes):
    queries, emb, tokens, layer = nodes
    params = replace(P, top_k=15, token_budget=500)
    res = collapsed_search(queries, emb, tokens, layer, params)
    full = collapsed_search(queries, emb, tokens, layer, replace(params, token_budget=10**9))
    for row, ref in zip(res.indices, full.indices):
        got = row[row >= 0]
        assert np.array_equal(got, ref[:len(got)]) and tokens[got].sum() <= 500
        assert len(got) == 15 or tokens[ref[:len(got) + 1]].sum() > 500


@pytest.mark.parametrize("p", [0.0, 0.3, 0.5, 0.8, 1.0])
def test_biased_search_proportion(nodes, p):
    queries, emb, tokens, layer = nodes
    params = replace(P, top_k=10, token_budget=10**9, detail_proportion=p, biased=True)
    res = search(queries, emb, tokens, layer, params)
    assert np.array_equal(res.indices, biased_search(queries, emb, tokens, layer, params).indices)
    n_detail = round(p * 10 + 1e-9)
    scores = queries @ emb.T
    leaf, summ = np.flatnonzero(layer == 0), np.flatnonzero(layer > 0)
    for qi, row in enumerate(res.indices):
        assert (row >= 0).all() and (layer[row] == 0).sum() == n_detail
        best_leaf = leaf[np.argsort(-scores[qi, leaf], kind="stable")[:n_detail]]
        best_summ = summ[np.argsort(-scores[qi, summ], kind="stable")[:10 - n_detail]]
        assert set(row) == set(best_leaf) | set(best_summ)
        assert np.all(np.diff(res.scores[qi]) <= 1e-6)


def test_biased_search_fills_a_shortfall(nodes):
    queries, emb, tokens, _ = nodes
    layer = np.zeros(len(emb), dtype=np.int64)
    layer[:3] = 1  # only 3 summary nodes
    params = replace(P, top_k=10, token_budget=10**9, detail_proportion=0.2)
    res = biased_search(queries, emb, tokens, layer, params)
    assert ((res.indices >= 0).sum(axis=1) == 10).all() and ((layer[res.indices] > 0).sum(axis=1) == 3).all()


# ---------------------------------------------------------------- summaries (tasks.llm.summarize) in a build


def test_whitespace_tokens():
    assert whitespace_tokens(["a b", "", "c"]).tolist() == [2, 0, 1]


def test_extractive_summariser_drives_a_build(data):
    ids, x, planes, _ = data
    texts = [f"Passage {i} talks about topic {i % 7}. It has a second sentence." for i in range(300)]
    calls = []

    def embed(batch: list[str]) -> np.ndarray:
        calls.append(len(batch))
        return np.random.default_rng(len(batch)).standard_normal((len(batch), x.shape[1]))

    h = build_hierarchy(ids[:300], x[:300], extractive_summariser(P.summary_tokens, embed), planes, P,
                        leaf_texts=texts)
    check_structure(h, P)
    summaries = h.nodes[h.nodes["layer"] > 0]
    assert (whitespace_tokens(summaries["text"]) <= P.summary_tokens).all()
    text_of = dict(zip(h.nodes["node_id"], h.nodes["text"]))
    children = h.nodes.groupby("parent_id")["node_id"].apply(list)
    for nid, summary in zip(summaries["node_id"], summaries["text"]):  # extractive: child sentences only
        pool = set(s for c in children[nid] for s in split_sentences(text_of[c]))
        assert summary and set(split_sentences(summary)) <= pool
    assert len(calls) == 2 * (h.n_layers - 1)  # one sentence batch + one summary batch per layer
    assert np.allclose(np.linalg.norm(h.embeddings[summaries.index], axis=1), 1, atol=1e-5)
    h0 = build_hierarchy(ids[:300], x[:300], extractive_summariser(50), planes, P, leaf_texts=texts)
    check_structure(h0, P)
