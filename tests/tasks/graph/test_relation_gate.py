"""The relation gate on a corpus where no document writes another's title: nothing to gate, no crash."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from tasks.graph.relation_gate import gate_patch, relation_gate


def test_no_gated_pair_gives_an_empty_gate_and_an_empty_patch():
    """scipy answers an empty fancy index with a sparse array, not values; the gate must not read it as weights
    (seen on seven long documents under experiment=beyond_paper: ZoomRAG and LinearRAG failed to load)."""
    n, m = 3, 4
    M = sp.csr_array(np.ones((n + m, n + m)))
    titled = sp.csr_array(([1.0], ([0], [0])), shape=(m, n))  # entity 0 titles document 0 ...
    chunk_entity = sp.csr_array(([1.0, 1.0], ([0, 1], [0, 2])), shape=(4, m))  # ... and only document 0 writes it
    gate = relation_gate(M, n, titled, chunk_entity, np.array([0, 0, 1, 2]), np.eye(4, 8, dtype=np.float32), 1.0)
    assert len(gate.doc) == len(gate.entity) == len(gate.weight) == 0
    patch = gate_patch(gate, np.ones((2, 8), dtype=np.float32))
    assert patch.delta.shape == (2, 0)
