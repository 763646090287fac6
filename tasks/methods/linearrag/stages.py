"""LinearRAG's index stages (§3.1). It declares none of its own: the Tri-Graph is built by the shared stages named
here (sentences by :func:`tasks.text.chunk.chunk`, mentions by :func:`tasks.llm.ner_backends.ner`, embeddings by
:func:`tasks.text.embed.embed`, the contain and mention matrices by :func:`tasks.text.entities.entity_graph`, and,
beyond the paper, :func:`tasks.text.linking_stages.linked_entity_graph` and
:func:`tasks.text.linking_stages.index_relation_embeddings`). Named here so that a method's stages are found in
the same file for every method; ``flows/methods/linearrag.py`` composes them."""
from tasks.llm.ner_backends import ner, ner_params
from tasks.text.chunk import ChunkParams, chunk
from tasks.text.embed import EmbedParams, embed
from tasks.text.entities import EntityGraphParams, EntityTextsParams, entity_graph, entity_texts
from tasks.text.linking_stages import (
    LinkedGraphParams,
    RelationSentencesParams,
    index_relation_embeddings,
    linked_entity_graph,
)

__all__ = ["ChunkParams", "EmbedParams", "EntityGraphParams", "EntityTextsParams", "LinkedGraphParams",
           "RelationSentencesParams", "chunk", "embed", "entity_graph", "entity_texts", "index_relation_embeddings",
           "linked_entity_graph", "ner", "ner_params"]
