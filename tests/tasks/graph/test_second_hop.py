"""The second hop (tasks.graph.second_hop): title links both ways, candidate scores against a brute-force oracle,
and a bridge passage that only the second hop brings into the top k."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from tasks.graph.second_hop import SecondHopParams, hop_scores, rank_prior, second_hop, source_weights, title_links


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# four passages, four names: passage i is titled by name i; passage 0 writes names 0 (its own) and 1,
# passage 2 writes name 0, passage 3 writes nothing
CONTAIN = sp.csr_array(np.array([[1, 1, 0, 0],
                                 [0, 1, 0, 0],
                                 [1, 0, 1, 0],
                                 [0, 0, 0, 1]], dtype=float))
TITLED = sp.csr_array(np.eye(4))


def test_title_links_follow_written_titles_forward_backward_or_both_and_never_to_itself():
    forward = title_links(CONTAIN, TITLED, "forward").toarray()
    assert forward.tolist() == [[0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert np.array_equal(title_links(CONTAIN, TITLED, "backward").toarray(), forward.T)
    assert np.array_equal(title_links(CONTAIN, TITLED, "both").toarray(), np.maximum(forward, forward.T))


def test_hop_scores_equal_a_dense_brute_force():
    rng = np.random.default_rng(0)
    n_p, n_q, dim = 30, 6, 8
    links = sp.csr_array((rng.random((n_p, n_p)) < 0.15).astype(float))
    q, p = _unit(rng.normal(size=(n_q, dim))), _unit(rng.normal(size=(n_p, dim)))
    sources = np.array([rng.permutation(n_p)[:4] for _ in range(n_q)])
    got = hop_scores(sources, links, q, p, decay=1.0).toarray()
    want = np.zeros((n_q, n_p))
    for i in range(n_q):
        for r, s in enumerate(sources[i], start=1):
            want[i] += (2.0 / (r + 1.0)) * links.toarray()[s]
    want = np.minimum(want, 1.0) * np.maximum(q @ p.T, 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_source_weights_and_rank_prior_follow_rank():
    w = source_weights(np.array([[2, 0, 1]]), 4, decay=1.0).toarray()
    np.testing.assert_allclose(w, [[2 / 3, 1 / 2, 1.0, 0.0]])
    np.testing.assert_allclose(rank_prior(np.array([[3, 1]]), 4, offset=5.0), [[0, 1 / 7, 0, 1 / 6]])


def _bridge_case():
    """Passage 0 is what the question names (ranked first); passage 2 writes passage 0's title and answers the
    rest of the question; passages 1 and 3 are dense distractors the first hop ranks above 2."""
    question = _unit(np.array([[1.0, 0.0, 0.0]]))
    passages = _unit(np.array([[0.2, 1.0, 0.0],    # 0: the named entity, little of the rest
                               [0.0, 0.0, 1.0],    # 1: distractor
                               [1.0, 0.3, 0.0],    # 2: the bridge's passage, matches the rest of the question
                               [0.0, 0.0, 1.0]]))  # 3: distractor
    first_hop = np.array([[1.0, 0.6, 0.1, 0.5]])  # ranking 0, 1, 3, 2
    return question, passages, first_hop


def test_the_second_hop_lifts_a_passage_that_writes_a_top_passages_title():
    question, passages, first_hop = _bridge_case()
    params = SecondHopParams(second_hop_weight=0.1, second_hop_sources=1, second_hop_depth=4)
    scores, rounds = second_hop(first_hop, title_links(CONTAIN, TITLED, "both"), question, passages, params)
    assert set(np.argsort(-scores[0])[:2].tolist()) == {0, 2}
    assert rounds.tolist() == [1]
    # forward links alone do not reach it: passage 0 does not write passage 2's title
    params_forward = SecondHopParams(second_hop_weight=0.1, second_hop_sources=1, second_hop_depth=4,
                                     second_hop_links="forward")
    scores, _ = second_hop(first_hop, title_links(CONTAIN, TITLED, "forward"), question, passages, params_forward)
    assert np.argsort(-scores[0])[:2].tolist() == [0, 1]


def test_rounds_go_on_until_no_new_passage_enters_the_top_sources():
    # a chain 0 -> 1 -> 2: round one lifts 1 into the top two, round two follows 1 to 2
    chain = sp.csr_array(np.array([[0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=float))
    question = _unit(np.ones((1, 2)))
    passages = _unit(np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 0.0]]))
    first_hop = np.array([[1.0, 0.0, 0.0, 0.5]])  # 0, 3 on top; 1 and 2 outside the depth
    params = dict(second_hop_weight=1.0, second_hop_sources=2, second_hop_depth=2, second_hop_rank_offset=1.0)
    one, r1 = second_hop(first_hop, chain, question, passages, SecondHopParams(**params, second_hop_rounds=1))
    more, r5 = second_hop(first_hop, chain, question, passages, SecondHopParams(**params, second_hop_rounds=5))
    assert one[0, 2] == 0.0 and one[0, 1] > 0  # one round reaches 1 only
    assert more[0, 2] > 0 and more[0, 1] > 0  # the second round starts from 1 and reaches 2; 1 stays found
    assert np.argsort(-more[0])[:2].tolist() in ([1, 2], [2, 1])
    assert r1.tolist() == [1] and r5.tolist() == [3]  # 1 entered, then 2, then nothing new: it stopped by itself


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="method.second_hop_links"):
        SecondHopParams(second_hop_links="sideways")
    with pytest.raises(ValueError, match="method.second_hop_query"):
        SecondHopParams(second_hop_query="llm")
