"""ArchRAG's community inputs (Alg. 1 line 7's input): a hand-made KG with known lines, and the grouping helper
they use (tasks.graph.sparse.group_positions)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.graph.sparse import group_positions
from tasks.methods.archrag.stages import CommunityInputs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_groups_equal_a_pandas_groupby_with_empty_groups_kept(seed):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 40, size=500)
    got = group_positions(keys, 45)  # keys 40..44 never occur: empty groups
    want = pd.Series(np.arange(keys.size)).groupby(keys).apply(np.asarray)
    assert len(got) == 45
    for k in range(45):
        assert np.array_equal(got[k], want.get(k, np.zeros(0, np.int64))), k


def _kg() -> CommunityInputs:
    entities = pd.DataFrame({"entity_id": range(5), "name": list("ABCDE"), "type": ["PER"] * 5,
                             "description": ["a", "b", "", "d", "e"]})
    #                 0: A-B  1: B-C  2: D-E  3: C-D   (degrees A1 B2 C2 D2 E1)
    relations = pd.DataFrame({"head": [0, 1, 3, 2], "tail": [1, 2, 4, 3], "weight": [1.0] * 4,
                              "description": ["ab", "bc", "", "cd"]})
    emb = np.eye(5, dtype=np.float32)
    return CommunityInputs(entities, relations, emb, budget_tokens=1000)


def test_level_one_lines_are_members_by_degree_then_relations_inside_busiest_first():
    inputs = _kg()
    first, second = inputs.communities(1, np.array([0, 0, 0, 1, 1]))
    assert first.title_hint == "B, C, A" and second.title_hint == "D, E"
    assert first.lines == ("B (PER): b", "C (PER)", "A (PER): a", "B -- C: bc", "A -- B: ab")
    assert first.n_extractive == 3 and np.array_equal(first.line_emb, np.eye(5, dtype=np.float32)[[1, 2, 0]])
    assert second.lines == ("D (PER): d", "E (PER): e", "D -- E")  # C-D crosses communities: in neither


def test_level_two_lines_are_children_reports_by_size_then_members_and_relations():
    inputs = _kg()
    labels = np.array([0, 0, 0, 1, 1])
    frame = pd.DataFrame({"title": ["t0", "t1"], "summary": ["s0", "s1"], "report": ["", ""],
                          "rating": [np.nan, np.nan], "source": ["extractive"] * 2})
    below = np.array([[1, 0], [0, 1]], dtype=np.float32)
    inputs.add_layer(labels, frame, below)
    (top,) = inputs.communities(2, np.array([0, 0]))
    assert top.title_hint == "t0; t1" and top.n_extractive == 2  # 3 entities under t0, 2 under t1
    assert top.lines == ("t0: s0", "t1: s1", "B (PER): b", "C (PER)", "D (PER): d", "A (PER): a", "E (PER): e",
                         "B -- C: bc", "C -- D: cd", "A -- B: ab", "D -- E")
    assert np.array_equal(top.line_emb, below)
