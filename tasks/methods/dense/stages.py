"""Dense baseline's index stages. It declares none of its own: its index is the shared passage embeddings
(:func:`tasks.text.embed.embed` over ``doc_id`` rows), which every embedding method reuses; the faiss index is
built on load (:mod:`tasks.methods.dense.retriever`). Named here so that a method's stages are found in the same
file for every method; ``flows/methods/dense.py`` composes them."""
from tasks.text.embed import EmbedParams, embed

__all__ = ["EmbedParams", "embed"]
