"""The title walk (beyond the papers): a passage-entity graph re-weighted so that a walk reaching a title's name goes
on to the passage it titles, for every method that walks such a graph (ZoomRAG's M, LinearRAG's Tri-Graph).

The settings, each at its paper value by default: ``title_edge_weight`` (extra weight of the edge from a title's
entity to the passage it titles), ``title_name_weight`` (factor on passage -> entity edges whose entity titles some
passage), ``idf_edges`` (passage -> entity edges also weighted by the entity's IDF, so hubs carry less) and
``lowercase_name_weight`` (factor on passage -> entity edges the passage writes only in lower case).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

TITLE_WALK_SETTINGS = "method.title_edge_weight / title_name_weight / idf_edges / lowercase_name_weight"


def title_walk_on(title_edge_weight: float, title_name_weight: float, idf_edges: bool,
                  lowercase_name_weight: float) -> bool:
    """Whether these settings change the paper's graph (any of them off its paper value)."""
    return title_edge_weight != 0.0 or title_name_weight != 1.0 or idf_edges or lowercase_name_weight != 1.0


def check_title_walk(on: bool, titles_are_nodes: bool, linking: str, gate_temperature: float, walk_suits_gate: bool,
                     gate_walk: str) -> None:
    """The settings a title walk and its relation gate need, with the fix in the error.

    ``on``: the title walk is on; ``titles_are_nodes``: the entity linking makes each title a node (``linking``
    names that setting); ``gate_temperature > 0`` gates the title walk's edges, so it needs the walk on and a walk
    that suits the gate (``walk_suits_gate``; ``gate_walk`` names that setting).
    """
    if on and not titles_are_nodes:
        raise ValueError(f"{TITLE_WALK_SETTINGS} (the title walk) need {linking}: with spaCy entities a passage's "
                         "title is no node")
    if gate_temperature > 0 and (not on or not walk_suits_gate):
        raise ValueError("method.relation_gate_temperature > 0 gates the title walk's edges: it needs the title "
                         f"walk (e.g. experiment=beyond_paper) and {gate_walk}")


def title_walk_edges(to_entity: sp.sparray, to_passage: sp.sparray, titled: sp.sparray, idf: np.ndarray,
                     title_edge_weight: float = 0.0, title_name_weight: float = 1.0, idf_edges: bool = False,
                     lowercase: sp.sparray | None = None,
                     lowercase_name_weight: float = 1.0) -> tuple[sp.csr_array, sp.csr_array]:
    """A passage-entity graph's edges re-weighted for the title walk: ``(to_entity, to_passage)``, the factors
    and new edges cast to each one's dtype; the defaults return them unchanged.

    ``to_entity`` (P x E) weighs passage -> entity edges, ``to_passage`` (E x P) entity -> passage edges, and
    ``titled`` (E x P) is 1 where entity e is the name in passage p's title. Entity -> passage edges gain
    ``title_edge_weight`` * titled, so a walk that reaches a name goes on mostly to the passage about it (the
    passage -> entity edge is not mirrored: the new edge is one way). Passage -> entity edges are multiplied by
    ``title_name_weight`` for names that title some passage (a passage's mention of another passage's title is
    the bridge of a multi-hop question) and by the name's ``idf`` when ``idf_edges``. ``lowercase`` (P x E,
    :func:`tasks.text.gazetteer.lowercase_only`): passage -> entity edges to names the passage writes only in
    lower case ("the princess") are multiplied by ``lowercase_name_weight``.
    """
    to_entity, to_passage = sp.csr_array(to_entity), sp.csr_array(to_passage)
    is_title = np.asarray(sp.csr_array(titled).sum(axis=1)).ravel() > 0
    factor = np.where(is_title, title_name_weight, 1.0)
    if idf_edges:
        factor = factor * np.asarray(idf, dtype=np.float64)
    to_entity = sp.csr_array(to_entity @ sp.diags_array(factor.astype(to_entity.dtype)))
    if lowercase is not None and lowercase_name_weight != 1.0:  # the text's case: a common noun, not a title
        to_entity = sp.csr_array(to_entity - (1.0 - lowercase_name_weight) * to_entity.multiply(sp.csr_array(lowercase)))
    to_passage = sp.csr_array(to_passage + (title_edge_weight * sp.csr_array(titled)).astype(to_passage.dtype))
    to_entity.eliminate_zeros()
    to_passage.eliminate_zeros()
    return to_entity, to_passage
