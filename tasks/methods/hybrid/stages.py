"""Hybrid baseline's index stages. It declares none of its own: its index is the dense baseline's passage
embeddings (:func:`tasks.text.embed.embed`) and the BM25 baseline's index (:func:`tasks.methods.bm25.stages.bm25_index`),
the very stages of ``method=dense`` and ``method=bm25``, so with those built it indexes nothing. Named here so that
a method's stages are found in the same file for every method; ``flows/methods/hybrid.py`` composes them."""
from tasks.methods.bm25.stages import bm25_index
from tasks.methods.bm25.params import BM25IndexParams
from tasks.text.embed import EmbedParams, embed

__all__ = ["BM25IndexParams", "EmbedParams", "bm25_index", "embed"]
