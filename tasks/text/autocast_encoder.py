"""Stored embeddings from the PyTorch encoder in bfloat16 (``embedder.precision=bf16``; beyond the paper).

Only texts of ``embedder.bf16_min_tokens`` tokens or more take this path (:func:`tasks.text.embed.encode_bf16`);
shorter ones, such as entity names, run no faster in bf16 here and keep their fp32 embeddings.

Under ``torch.autocast`` the transformer's weight products run in bfloat16 while layer norms, softmax and the
pooling stay float32. On a CPU with AVX-512 BF16 (this box's EPYC) a 2Wiki passage takes about 0.75x, and a
256-token text about 0.65x, the time of the fp32 ONNX Runtime encoder; the embeddings are within cosine
0.9999 of fp32 (README, "bfloat16 stored embeddings"). A CPU without native bf16 products computes the same
values, slower than fp32: :func:`load_bf16_encoder` says so in the log.

The texts are batched as :class:`~tasks.text.onnx_encoder.OnnxEncoder` batches them (tokenised once, cut
into batches of nearly equal token counts, padding cut to each batch's longest); only the forward pass is
PyTorch's. A bf16 embedding moves a little with the padding of its batch (up to about 1e-3 in a coordinate
here), where fp32's does not.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from tasks.core.progress import timed
from tasks.text.encoder import load_encoder, model_path
from tasks.text.onnx_encoder import (
    PROBE,
    OnnxEncoder,
    OnnxExportError,
    Tokenize,
    _check_pipeline,
    fast_tokenizer,
    hf_tokenizer,
)

log = logging.getLogger("dagrag")

BF16_MIN_COSINE = 0.999  # bf16 vs fp32 eager embeddings of the probe strings: each at least this (~0.99995 here)


class AutocastSession:
    """The transformer's forward pass under bfloat16 autocast, called as ONNX Runtime's ``session.run`` is."""

    def __init__(self, model: Any, device: str) -> None:
        self.model = model.eval()
        self.device = device

    def run(self, _outputs: None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        import torch

        with torch.inference_mode(), torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16):
            hidden = self.model(**{k: torch.from_numpy(v).to(self.device) for k, v in feed.items()}).last_hidden_state
        return [hidden.float().cpu().numpy()]


def cpu_has_bf16() -> bool | None:
    """Whether the CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX); None where /proc/cpuinfo is absent."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return "avx512_bf16" in flags or "amx_bf16" in flags


COUNT_CHUNK = 1024  # texts tokenised at a time to count their tokens (each chunk padded to its longest)


@functools.lru_cache(maxsize=4)
def _tokenizer(model: str, max_seq_length: int) -> Tokenize:
    """The tokenizer the fp32 ONNX Runtime path uses: ``tokenizer.json`` through ``tokenizers``, else the model's own."""
    folder = Path(model_path(model))
    fast = fast_tokenizer(folder, max_seq_length) if folder.is_dir() else None
    return fast or hf_tokenizer(load_encoder(model, max_seq_length, "cpu").tokenizer, max_seq_length)


def token_counts(texts: list[str], model: str, max_seq_length: int) -> np.ndarray:
    """Each text's token count as the encoder sees it (special tokens included, truncated at ``max_seq_length``)."""
    tokenize = _tokenizer(model, max_seq_length)
    chunks = [tokenize(list(texts[i:i + COUNT_CHUNK]))["attention_mask"].sum(axis=1)
              for i in range(0, len(texts), COUNT_CHUNK)]
    return np.concatenate([np.zeros(0, dtype=np.int64), *chunks])


@contextlib.contextmanager
def _passive_openmp() -> Iterator[None]:
    """Import torch with its OpenMP workers sleeping between parallel regions (``OMP_WAIT_POLICY=PASSIVE``, read
    once, when torch's libgomp loads) unless the user set the variable; the environment is restored afterwards,
    so child processes and other OpenMP libraries (faiss) keep theirs. Spinning workers held the cores that
    spaCy's NER shares with the encoder in ZoomRAG's build: its 2Wiki index with bf16 took 212 and 201 s
    passive against 220 and 220 s spinning, while dense's passages alone took 77 and 76 s against 78 and 71 s
    (README, "bfloat16 stored embeddings"). No effect where torch is already imported."""
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ:
        yield
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        yield
    finally:
        del os.environ["OMP_WAIT_POLICY"]


@functools.lru_cache(maxsize=4)
def load_bf16_encoder(model: str, max_seq_length: int, device: str) -> OnnxEncoder:
    """``model``'s transformer under bfloat16 autocast, with the tokenizer and mean pooling of the fp32 path,
    checked against the fp32 eager encoder on probe strings (cosine at least :data:`BF16_MIN_COSINE`)."""
    with _passive_openmp():
        import torch

    enc = load_encoder(model, max_seq_length, device)
    _check_pipeline(enc)
    if device == "cpu" and cpu_has_bf16() is False:
        log.warning("this CPU has no native bfloat16 products (avx512_bf16, amx_bf16): embedder.precision=bf16 "
                    "computes the same values, more slowly than fp32")
    tokenize = _tokenizer(model, max_seq_length)
    names = tuple(n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tokenize(PROBE[:1]))
    dim = getattr(enc, "get_embedding_dimension", enc.get_sentence_embedding_dimension)()
    out = OnnxEncoder(AutocastSession(enc[0].auto_model, device), tokenize, names, dim)
    with timed(f"checking {model} in bfloat16 against fp32"), torch.backends.mkldnn.flags(enabled=True):
        eager = enc.encode(PROBE, normalize_embeddings=True, convert_to_numpy=True)
        cosine = float((out.encode(PROBE, 2) * eager).sum(axis=1).min())
    if cosine < BF16_MIN_COSINE:
        raise OnnxExportError(f"{model!r} in bfloat16 is too far from fp32 (cosine {cosine:.4f} < "
                              f"{BF16_MIN_COSINE}); set embedder.precision=fp32")
    return out
