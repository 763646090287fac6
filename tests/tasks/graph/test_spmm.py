"""Tests for tasks/graph/spmm.py: the compiled CSR x dense product equals scipy's bit for bit."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tasks.graph.spmm import csr_times_dense


def random_csr(rng: np.random.Generator, shape: tuple[int, int], dtype) -> sp.csr_array:
    m = sp.random_array(shape, density=0.08, rng=rng, format="csr", dtype=dtype)
    m.data = (m.data * 10 - 3).astype(dtype)  # signed weights of several magnitudes
    return m


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("q", [1, 3, 32, 64])
@pytest.mark.parametrize("seed", range(3))
def test_csr_times_dense_equals_scipy_bit_for_bit(dtype, q: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = random_csr(rng, (120, 90), dtype).tolil()
    m[5] = 0  # an empty row
    m = sp.csr_array(m)
    dense = rng.standard_normal((90, q)).astype(dtype)
    assert np.array_equal(csr_times_dense(m, dense), m @ dense)
    shuffled = sp.csr_array(m[:, rng.permutation(90)][:, np.argsort(rng.permutation(90))])  # unsorted indices
    assert np.array_equal(csr_times_dense(shuffled, dense), shuffled @ dense)
    wide = sp.csr_array((m.data, m.indices.astype(np.int64), m.indptr.astype(np.int64)), shape=m.shape)
    assert np.array_equal(csr_times_dense(wide, dense), m @ dense)
    strided = np.asfortranarray(dense)  # not C-ordered
    assert np.array_equal(csr_times_dense(m, strided), m @ dense)


def test_other_operands_go_to_scipy_and_shapes_are_checked() -> None:
    rng = np.random.default_rng(0)
    m = random_csr(rng, (30, 20), np.float64)
    dense = rng.standard_normal((20, 4))
    assert np.array_equal(csr_times_dense(m, dense.astype(np.float32)), m @ dense.astype(np.float32))  # dtypes
    assert np.array_equal(csr_times_dense(m.tocsc(), dense), m.tocsc() @ dense)
    assert np.array_equal(csr_times_dense(m, dense[:, 0]), m @ dense[:, 0])  # a vector
    with pytest.raises(ValueError, match="mismatch"):
        csr_times_dense(m, rng.standard_normal((21, 4)))


def test_out_is_written_and_checked() -> None:
    rng = np.random.default_rng(1)
    m = random_csr(rng, (30, 20), np.float32)
    dense = rng.standard_normal((20, 4)).astype(np.float32)
    dense = rng.standard_normal((20, 40)).astype(np.float32)  # wide enough for the compiled kernel
    out = np.full((30, 40), np.nan, np.float32)  # stale values are overwritten, not added to
    assert csr_times_dense(m, dense, out=out) is out and np.array_equal(out, m @ dense)
    with pytest.raises(ValueError, match="C-ordered"):
        csr_times_dense(m, dense, out=np.empty((30, 41), np.float32))
    square = random_csr(rng, (20, 20), np.float32)
    with pytest.raises(ValueError, match="shares memory"):
        csr_times_dense(square, dense, out=dense)
    dense = dense[:, :4]
    scipy_path = np.empty((30, 4))  # float64 operands of different dtypes go to scipy and are copied in
    assert np.array_equal(csr_times_dense(m, dense.astype(np.float64), out=scipy_path), m @ dense.astype(np.float64))
