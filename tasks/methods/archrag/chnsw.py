"""ArchRAG's C-HNSW index (paper §3.1.3, §3.2.1 Alg. 2, App. A.2 Alg. 3, §B.2/B.3).

C-HNSW is a list of per-layer graphs with one link per node to the layer below:

* layer 0 holds the entity vectors, layer ``l >= 1`` the level-``l`` community (AC) vectors;
  every node lives in exactly one layer (§3.1.3, unlike HNSW's nested layers);
* intra-layer links (eq. 1): one faiss ``IndexHNSWFlat`` per layer, inner product on L2-normalised
  vectors (§B.2 says inner product; the authors' code uses L2). The per-layer HNSW's own nested upper
  levels are only a construction aid: the C-HNSW search enters a layer at its level-0 graph from the
  node the inter-layer link points to (``IndexHNSW.search_level_0``). The top layer, which has no
  link into it, is searched with its own HNSW (Alg. 2 line 1 starts from an arbitrary node there);
* inter-layer links (eq. 2): ``psi(v)`` = the nearest node (largest inner product) of layer ``l-1``
  for every node ``v`` of layer ``l >= 1``.

Hierarchical search (Alg. 2) runs a whole batch of queries down the layers together: each query's
nearest hit at layer ``i+1`` gives, through its inter-layer link, the entry point at layer ``i``.
Every layer is searched by default (the code's "levels 0 and 1 only" and its efSearch stuck at 16 are
defects, see notes §3). Defaults M = 32, efConstruction = 100, efSearch = 100 (§B.3).

Small layers (``n <= 2*M`` nodes, where the level-0 HNSW graph, of degree 2M, would be nearly
complete anyway) are stored flat and always searched exactly; so is every layer when the index is
built with ``exact=True``. ``search(..., exact=True)`` gives brute-force top-k on every layer.

Build is deterministic: the installed faiss (1.15.1) builds HNSW graphs deterministically whatever
the thread count (checked: identical bytes with 1 and 2 OpenMP threads), and the links are exact.
Older faiss releases (the project allows >= 1.8) may build differently with several threads.

Pure numpy / faiss: no I/O. ``to_bytes`` / ``from_bytes`` give one blob for a pipeline stage.
"""
from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import faiss
import numpy as np

_FORMAT_VERSION = 1


@dataclass
class CHNSWParams:
    """Build/search settings; defaults are the paper's benchmark settings (§B.3)."""

    M: int = 32
    ef_construction: int = 100
    ef_search: int = 100
    exact: bool = False


def normalise(x: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation to float32 (§B.2: inner product = cosine); zero rows stay zero."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, np.float32(1e-12)), dtype=np.float32)


def inter_layer_links(upper: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """psi (eq. 2): for every row of ``upper`` (layer l) the index of its nearest row of ``lower`` (layer l-1).

    Computed exactly (brute-force inner product) instead of Alg. 3's insertion-time updates: upper
    layers are small, and Alg. 3's rule (re-point c's link whenever a closer node of the layer below
    is inserted, then fill any missing link) converges to exactly this nearest neighbour.
    """
    _, ids = faiss.knn(upper, lower, 1, metric=faiss.METRIC_INNER_PRODUCT)
    return ids[:, 0].astype(np.int64)


def _small_layer(n: int, M: int) -> bool:
    """A layer this small is kept flat (exact search): its level-0 HNSW graph (degree 2M) is near-complete."""
    return n <= 2 * M


def _build_layer(x: np.ndarray, params: CHNSWParams) -> faiss.Index:
    """One layer's intra-layer graph (eq. 1): IndexHNSWFlat (IP), or a flat IP index if small / exact."""
    d = x.shape[1]
    if params.exact or _small_layer(len(x), params.M):
        index = faiss.IndexFlatIP(d)
    else:
        index = faiss.IndexHNSWFlat(d, params.M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = params.ef_construction
    index.add(x)
    return index


def _hnsw_params(ef: int) -> faiss.SearchParametersHNSW:
    p = faiss.SearchParametersHNSW()
    p.efSearch = int(ef)
    return p


def _pad_fix(ids: np.ndarray, sims: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """faiss pads missing hits with id -1 and -FLT_MAX; make the padding -inf and the dtypes fixed."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    sims = np.ascontiguousarray(sims, dtype=np.float32)
    sims[ids < 0] = -np.inf
    return ids, sims


class CHNSW:
    """Community-based HNSW: per-layer HNSW graphs plus inter-layer links (§3.1.3)."""

    sizes: list[int]
    inter: list[np.ndarray]

    def __init__(self, indexes: list[faiss.Index], inter: list[np.ndarray], params: CHNSWParams):
        if not indexes:
            raise ValueError("C-HNSW needs at least one layer")
        if len(inter) != len(indexes):
            raise ValueError("one inter-layer link array per layer (inter[0] empty)")
        for level in range(1, len(indexes)):
            if len(inter[level]) != indexes[level].ntotal:
                raise ValueError(f"inter[{level}] has {len(inter[level])} links for {indexes[level].ntotal} nodes")
        self.indexes = indexes
        self.inter = inter
        self.params = params
        self.sizes = [int(ix.ntotal) for ix in indexes]
        self.d = int(indexes[0].d)

    @property
    def n_layers(self) -> int:
        return len(self.sizes)

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, layers: list[np.ndarray], params: CHNSWParams | None = None) -> CHNSW:
        """Build from per-layer vectors: ``layers[0]`` entities, ``layers[l]`` level-l communities.

        Vectors are L2-normalised here (defensively). Intra-layer graphs: one HNSW per layer; inter-layer
        links: exact nearest neighbour in the layer below (eq. 2, see :func:`inter_layer_links`).
        """
        params = params or CHNSWParams()
        if not layers:
            raise ValueError("C-HNSW needs at least one layer")
        xs = [normalise(x) for x in layers]
        d = xs[0].shape[1]
        for level, x in enumerate(xs):
            if x.shape[1] != d:
                raise ValueError(f"layer {level} has dimension {x.shape[1]}, layer 0 has {d}")
            if len(x) == 0:
                raise ValueError(f"layer {level} is empty")
        indexes = [_build_layer(x, params) for x in xs]
        inter = [np.empty(0, dtype=np.int64)]
        inter += [inter_layer_links(xs[level], xs[level - 1]) for level in range(1, len(xs))]
        return cls(indexes, inter, params)

    # ----------------------------------------------------------------- search
    def _is_flat(self, level: int) -> bool:
        return not isinstance(self.indexes[level], faiss.IndexHNSW)

    def _exact_layer(self, level: int, q: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Brute-force inner-product top-k over one layer (the HNSW's flat storage, no extra copy)."""
        index = self.indexes[level]
        flat = index if self._is_flat(level) else faiss.downcast_index(index.storage)
        sims, ids = flat.search(q, k)
        return _pad_fix(ids, sims)

    def _search_top(self, level: int, q: np.ndarray, k: int, ef: int) -> tuple[np.ndarray, np.ndarray]:
        """Alg. 2 line 1-4 at the top layer: nothing links into it, so use the layer's own HNSW entry."""
        if self._is_flat(level):
            return self._exact_layer(level, q, k)
        sims, ids = self.indexes[level].search(q, k, params=_hnsw_params(max(ef, k)))
        return _pad_fix(ids, sims)

    def _search_from(self, level: int, q: np.ndarray, entry: np.ndarray, k: int, ef: int
                     ) -> tuple[np.ndarray, np.ndarray]:
        """Alg. 2 line 4 (SearchLayer) at a lower layer: beam search (ef) on its level-0 graph from ``entry``."""
        if self._is_flat(level):
            return self._exact_layer(level, q, k)
        index = self.indexes[level]
        n = len(q)
        entry = np.ascontiguousarray(entry, dtype=np.int32).reshape(n, 1)  # storage_idx_t, nprobe = 1
        entry_x = index.reconstruct_batch(entry[:, 0].astype(np.int64))
        entry_sim = np.einsum("ij,ij->i", q, entry_x).astype(np.float32).reshape(n, 1)
        # newer faiss (hnsw.is_similarity) keeps IP as a similarity; older versions search on -IP
        nearest_d = entry_sim if getattr(index.hnsw, "is_similarity", False) else -entry_sim
        nearest_d = np.ascontiguousarray(nearest_d, dtype=np.float32)
        sims = np.empty((n, k), dtype=np.float32)
        ids = np.empty((n, k), dtype=np.int64)
        index.search_level_0(n, faiss.swig_ptr(q), k, faiss.swig_ptr(entry), faiss.swig_ptr(nearest_d),
                             faiss.swig_ptr(sims), faiss.swig_ptr(ids), 1, 1, _hnsw_params(max(ef, k)))
        return _pad_fix(ids, sims)

    def _entry_points(self, level: int, upper_ids: np.ndarray) -> np.ndarray:
        """Alg. 2 lines 6-7: nearest hit c at layer level+1, then s = psi(c) in layer ``level``."""
        c = upper_ids[:, 0]
        s = self.inter[level + 1][np.maximum(c, 0)]
        if (c < 0).any() and not self._is_flat(level):  # no hit above (not on a non-empty layer)
            s = np.where(c < 0, self.indexes[level].hnsw.entry_point, s)
        return s

    def search(self, queries: np.ndarray, k: int | Sequence[int], *, layers: Sequence[int] | None = None,
               ef_search: int | None = None, exact: bool | None = None
               ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Hierarchical search (Alg. 2), batched: per layer the top-k (ids, sims) for every query.

        ``k``: one int for all layers or one per layer. ``layers``: the layers to return (default all);
        the descent still passes through every layer above the lowest one asked for, each searched
        with its own k, so a layer's hits do not depend on which layers are asked for. Queries are
        L2-normalised, so sims are cosines. Returns ``result[l] = (ids (B, k_l) int64, sims (B, k_l)
        float32)`` sorted by sim descending, padded with id -1 / sim -inf when a layer has fewer than
        k_l nodes; layers not asked for get empty (B, 0) arrays. Layer i is searched with
        ef = max(ef_search, k_i). ``exact=True`` gives brute-force top-k on every layer.
        """
        q = normalise(queries)
        if q.shape[1] != self.d:
            raise ValueError(f"queries have dimension {q.shape[1]}, index has {self.d}")
        n_layers = self.n_layers
        ks = [int(k)] * n_layers if np.isscalar(k) else [int(x) for x in k]
        if len(ks) != n_layers:
            raise ValueError(f"k has {len(ks)} entries for {n_layers} layers")
        if any(x < 0 for x in ks):
            raise ValueError("k must be >= 0")
        wanted = sorted(set(range(n_layers) if layers is None else (int(x) for x in layers)))
        if any(x < 0 or x >= n_layers for x in wanted):
            raise ValueError(f"layers must lie in [0, {n_layers})")
        ef = self.params.ef_search if ef_search is None else int(ef_search)
        exact = self.params.exact if exact is None else bool(exact)
        B = len(q)
        result = [(np.empty((B, 0), dtype=np.int64), np.empty((B, 0), dtype=np.float32))] * n_layers
        if not wanted:
            return result
        if B == 0:
            return [(np.empty((0, ks[i]), dtype=np.int64), np.empty((0, ks[i]), dtype=np.float32))
                    if i in wanted else result[i] for i in range(n_layers)]

        if exact:
            for level in wanted:
                if ks[level] > 0:
                    result[level] = self._exact_layer(level, q, ks[level])
            return result

        # Alg. 2 lines 3-7: top layer L down to the lowest layer asked for; a layer with k = 0 is still
        # searched for 1 hit, its nearest node giving the entry point below.
        ids = sims = None
        for level in range(n_layers - 1, wanted[0] - 1, -1):
            k_run = max(ks[level], 1)
            if level == n_layers - 1:
                ids, sims = self._search_top(level, q, k_run, ef)
            else:
                ids, sims = self._search_from(level, q, self._entry_points(level, ids), k_run, ef)
            if level in wanted:
                result[level] = (np.ascontiguousarray(ids[:, :ks[level]]), np.ascontiguousarray(sims[:, :ks[level]]))
        return result

    # ------------------------------------------------------------ persistence
    def to_bytes(self) -> bytes:
        """One blob: numpy ``savez`` of every layer's ``faiss.serialize_index``, the links and the params."""
        arrays: dict[str, np.ndarray] = {
            "version": np.array(_FORMAT_VERSION, dtype=np.int64),
            "sizes": np.array(self.sizes, dtype=np.int64),
            "params": np.array([self.params.M, self.params.ef_construction, self.params.ef_search,
                                int(self.params.exact)], dtype=np.int64),
        }
        for level, index in enumerate(self.indexes):
            arrays[f"index_{level}"] = faiss.serialize_index(index)
            arrays[f"inter_{level}"] = np.asarray(self.inter[level], dtype=np.int64)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> CHNSW:
        """Inverse of :meth:`to_bytes`."""
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            version = int(z["version"])
            if version != _FORMAT_VERSION:
                raise ValueError(f"unknown C-HNSW blob version {version}")
            sizes = [int(x) for x in z["sizes"]]
            M, ef_c, ef_s, exact = (int(x) for x in z["params"])
            indexes = [faiss.deserialize_index(np.ascontiguousarray(z[f"index_{i}"]))
                       for i in range(len(sizes))]
            inter = [np.array(z[f"inter_{i}"], dtype=np.int64) for i in range(len(sizes))]
        out = cls(indexes, inter, CHNSWParams(M=M, ef_construction=ef_c, ef_search=ef_s, exact=bool(exact)))
        if out.sizes != sizes:
            raise ValueError("C-HNSW blob: layer sizes do not match the stored indexes")
        return out

    def params_dict(self) -> dict:
        """The build/search settings as a plain dict (for a stage's manifest)."""
        return asdict(self.params)
