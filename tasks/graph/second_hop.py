"""The second hop (beyond the papers): follow what the first hop's passages name, with title links in place of an LLM.

IRCoT (Trivedi et al., 2023) retrieves again with what the last retrieved passages say; here the "next query" is the
graph's own: the top passages of a ranking (the *sources*) lead to the passages they are linked to by a title, in
either direction (a film's passage writes its director's name, which titles the director's passage; a song's passage
writes the singer's name, which titles the passage the question describes). Each linked passage (a *candidate*) is
scored by how well its sources ranked and by how well the rest of the question matches it (the cosine of the
question read without the names it writes, or without the bridge it describes: what is asked *about* the bridge).
The ranking becomes a rank prior plus ``weight`` times that score, and the hop repeats from the new top until no new
passage enters it. HippoRAG 2 puts passage nodes into its walk; LinearRAG's semantic bridging follows the sentences
the question matches; ZoomRAG restarts its walk. None of the papers does this.

Pure numpy / scipy.sparse: no I/O, no models (the question and passage vectors come in).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from tasks.core.limits import COUNT, COUNT0, POSITIVE, one_of
from tasks.graph.topk import top_k_rows

LINK_DIRECTIONS = ("forward", "backward", "both")  # SecondHopParams.second_hop_links
HOP_QUERIES = ("whole", "masked", "parsed")  # SecondHopParams.second_hop_query


@dataclass(frozen=True)
class SecondHopParams:
    """Beyond the papers: the second hop's settings; ``second_hop_weight`` 0 (the default) turns it off.

    ``second_hop_sources``: how many top passages each round follows. ``second_hop_source_decay``: a source at rank r
    weighs (1 + decay) / (r + decay) (rank 1 weighs 1). ``second_hop_links``: ``forward`` (the passages whose titles a
    source writes), ``backward`` (the passages that write a source's title) or ``both``. ``second_hop_rank_offset``:
    the first hop's ranking enters as 1 / (rank + offset). ``second_hop_depth``: how many of its ranks do.
    ``second_hop_rounds``: at most this many rounds; a question stops as soon as its top sources stay the same.
    ``second_hop_query``: what a candidate is matched with: the ``whole`` question, the question ``masked`` (the
    names it writes capitalised left out) or ``parsed`` (spaCy's parse: the bridge it describes left out, see
    :mod:`tasks.text.question_parse`).
    """

    second_hop_weight: float = field(default=0.0, metadata=COUNT0)
    second_hop_sources: int = field(default=5, metadata=COUNT)
    second_hop_source_decay: float = field(default=1.0, metadata=COUNT0)
    second_hop_links: str = field(default="both", metadata=one_of(LINK_DIRECTIONS))
    second_hop_rank_offset: float = field(default=5.0, metadata=POSITIVE)
    second_hop_depth: int = field(default=50, metadata=COUNT)
    second_hop_rounds: int = field(default=1, metadata=COUNT)
    second_hop_query: str = field(default="masked", metadata=one_of(HOP_QUERIES))

    def __post_init__(self) -> None:
        if self.second_hop_links not in LINK_DIRECTIONS:
            raise ValueError(f"method.second_hop_links must be one of {LINK_DIRECTIONS}, got {self.second_hop_links!r}")
        if self.second_hop_query not in HOP_QUERIES:
            raise ValueError(f"method.second_hop_query must be one of {HOP_QUERIES}, got {self.second_hop_query!r}")

    @property
    def second_hop(self) -> bool:
        """Whether the second hop runs."""
        return self.second_hop_weight > 0


def title_links(contain: sp.sparray, titled: sp.sparray, direction: str = "both") -> sp.csr_array:
    """(P x P) 0/1 title links: ``forward`` [p, c] = 1 where passage p writes a name that titles passage c (c != p);
    ``backward`` is its transpose (c writes p's title); ``both`` is either. ``contain`` (P x E) holds the names each
    passage writes, ``titled`` (E x P) the passages each name titles."""
    written = sp.csr_array(contain, dtype=np.float64, copy=True)
    written.data[:] = 1.0
    forward = sp.csr_array(written @ sp.csr_array(titled, dtype=np.float64)).tolil()
    forward.setdiag(0.0)  # a passage writing its own title is no hop
    forward = sp.csr_array(forward)
    forward.eliminate_zeros()
    links = {"forward": forward, "backward": sp.csr_array(forward.T),
             "both": sp.csr_array(forward + forward.T)}[direction]
    links.data[:] = 1.0
    return links


def rank_prior(ranked: np.ndarray, n_passages: int, offset: float) -> np.ndarray:
    """(Q x P): 1 / (rank + ``offset``) for the passages of ``ranked`` (Q x depth, best first, rank 1 first), 0 else."""
    n_q, depth = ranked.shape
    prior = np.zeros((n_q, n_passages))
    np.put_along_axis(prior, ranked, (1.0 / (np.arange(1, depth + 1) + offset))[None, :].repeat(n_q, 0), axis=1)
    return prior


def source_weights(sources: np.ndarray, n_passages: int, decay: float) -> sp.csr_array:
    """(Q x P) the weight of each source: (1 + decay) / (r + decay) at rank r of ``sources`` (Q x m, best first)."""
    n_q, m = sources.shape
    weight = (1.0 + decay) / (np.arange(1, m + 1) + decay) if m else np.zeros(0)
    return sp.csr_array((np.tile(weight, n_q), (np.repeat(np.arange(n_q), m), sources.ravel())),
                        shape=(n_q, n_passages))


def hop_scores(sources: np.ndarray, links: sp.csr_array, query_emb: np.ndarray, passage_emb: np.ndarray,
               decay: float) -> sp.csr_array:
    """(Q x P) each candidate's second-hop score: the summed weight of the sources linked to it (at most 1) times
    max(0, cos(query, candidate)). Only linked pairs are scored (no Q x P product)."""
    support = sp.csr_array(source_weights(sources, links.shape[0], decay) @ links).tocoo()
    support.sum_duplicates()
    rows, cols = support.row, support.col
    cos = np.einsum("ij,ij->i", np.asarray(query_emb, np.float32)[rows], np.asarray(passage_emb, np.float32)[cols])
    score = np.minimum(support.data, 1.0) * np.maximum(cos, 0.0)
    return sp.csr_array((score, (rows, cols)), shape=support.shape)


def second_hop(scores: np.ndarray, links: sp.csr_array, query_emb: np.ndarray, passage_emb: np.ndarray,
               params: SecondHopParams) -> tuple[np.ndarray, np.ndarray]:
    """The first hop's ``scores`` (Q x P) re-scored by title links from its top passages, round after round.

    Returns ``(scores, rounds)``: rank prior (:func:`rank_prior` of the first hop's top ``second_hop_depth``) plus
    ``second_hop_weight`` × the best :func:`hop_scores` any round gave (each round starts from the top
    ``second_hop_sources`` of the last); ``rounds`` (Q,) counts the rounds each question took. A question stops when a round leaves its top sources as they were (nothing new
    entered), or after ``second_hop_rounds``.
    """
    n_q, n_p = scores.shape
    m = min(params.second_hop_sources, n_p)
    prior = rank_prior(top_k_rows(scores, min(params.second_hop_depth, n_p)), n_p, params.second_hop_rank_offset)
    out, rounds, best = prior.copy(), np.zeros(n_q, np.int64), np.zeros_like(prior)
    active = np.arange(n_q)
    sources = top_k_rows(prior, m)
    for _ in range(params.second_hop_rounds):
        if active.size == 0:
            break
        hop = hop_scores(sources[active], links, query_emb[active], passage_emb, params.second_hop_source_decay)
        best[active] = np.maximum(best[active], hop.toarray())  # what an earlier round found stays found
        out[active] = prior[active] + params.second_hop_weight * best[active]
        rounds[active] += 1
        moved = top_k_rows(out[active], m)
        changed = np.any(np.sort(moved, axis=1) != np.sort(sources[active], axis=1), axis=1)
        sources[active] = moved
        active = active[changed]
    return out, rounds


__all__ = ["HOP_QUERIES", "LINK_DIRECTIONS", "SecondHopParams", "hop_scores", "rank_prior", "second_hop",
           "source_weights", "title_links"]
