"""Tests for tasks/graph/sparse.py (COO tables <-> csr_array, link lists) and the purity of tasks/graph."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

import tasks.graph
from tasks.graph.sparse import coo_matrix, links_matrix, locality_order, to_coo


def test_coo_table_round_trip():
    a = sp.random_array((7, 5), density=0.4, rng=np.random.default_rng(0), format="csr")
    table = to_coo(a)
    assert list(table.columns) == ["row", "col", "value"]
    assert table["row"].dtype == np.int64 and table["col"].dtype == np.int64
    back = coo_matrix(table, a.shape)
    assert isinstance(back, sp.csr_array) and back.dtype == np.float64
    assert np.array_equal(back.toarray(), a.toarray())


def test_coo_matrix_sums_duplicate_cells():
    table = pd.DataFrame({"row": [0, 0, 2], "col": [1, 1, 0], "value": [1.0, 2.5, 4.0]})
    assert coo_matrix(table, (3, 2)).toarray().tolist() == [[0, 3.5], [0, 0], [4, 0]]


def test_links_matrix():
    got = links_matrix([[2, 0], [], [1]], 3)
    assert got.shape == (3, 3) and got.toarray().tolist() == [[1, 0, 1], [0, 0, 0], [0, 1, 0]]
    assert links_matrix([], 4).shape == (0, 4)


def test_locality_order_recovers_a_shuffled_path():
    """A path graph with its nodes shuffled: the renumbering puts every edge between consecutive nodes again."""
    n = 200
    shuffle = np.random.default_rng(0).permutation(n)
    path = sp.csr_array((np.ones(n - 1), (shuffle[:-1], shuffle[1:])), shape=(n, n))  # one direction only
    order = locality_order(path)
    assert np.array_equal(np.sort(order), np.arange(n))
    renumbered = sp.coo_array(path[order][:, order])
    assert np.abs(renumbered.row - renumbered.col).max() == 1
    assert np.abs(sp.coo_array(path).row - sp.coo_array(path).col).max() > 1


def test_graph_package_is_pure():
    """No I/O, no Prefect, no models: numeric libraries and pure standard modules only."""
    allowed = {"__future__", "dataclasses", "heapq", "math", "typing", "warnings", "numpy", "scipy", "pandas", "faiss",
               "concurrent",  # concurrent.futures: compute threads (numpy and scipy release the GIL), no I/O
               "numba"}  # the encoding tree's compiled merge, the walks' products
    for path in Path(tasks.graph.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        # the package's own modules, and the field limits (stdlib declarations) a params dataclass's fields carry
        own = {name for name in names if name.startswith("tasks.graph.") or name == "tasks.core.limits"}
        assert {name.split(".")[0] for name in names - own} <= allowed, path.name
