"""Hybrid baseline: reciprocal-rank fusion of the dense and BM25 rankings over their cached indexes."""
