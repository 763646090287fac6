"""The gain of one greedy-merge step (eq. (1), K=2), shared by the interpreted merge
(:mod:`tasks.graph.encoding_tree`) and the compiled one (:mod:`tasks.graph.encoding_tree_compiled`, which
compiles it with numba). Its own module so that neither merge module imports the other at load time."""
from __future__ import annotations

import math


def grown_gain(between: float, v_a: float, in_a: float, log_v_a: float, v_k: float, in_k: float, log_v_k: float,
               log_vol: float, vol: float) -> float:
    """:func:`tasks.graph.encoding_tree.merge_gain` of a community A just grown by a merge (V_A, in_A and
    log2 V_A known) with a neighbour K, in the greedy merge's floating-point order; both merge engines call it
    (numba compiles it too)."""
    l_new = math.log2(v_a + v_k)
    r = 2.0 * between * (log_vol - l_new) + in_a * (log_v_a - l_new)
    if in_k > 0:
        r += in_k * (log_v_k - l_new)
    return r / vol
