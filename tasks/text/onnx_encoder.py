"""Online query encoding with ONNX Runtime: the same sentence-transformers weights, exported once per process.

On this 2-core box ONNX Runtime runs MiniLM on short questions about 1.35x faster than PyTorch eager
(3.3 vs 4.5 ms per question at batch 256, sub-batches of 16), with embeddings equal to 2e-7. Questions
use it by default (``embedder.query_runtime``); stored embeddings when ``embedder.doc_runtime=onnxruntime``.

``embedder.precision=int8`` (beyond the paper, approximate) quantises the exported transformer's weights to
int8 (ONNX Runtime dynamic quantisation); it is checked by cosine to the eager encoder, not to 1e-5.

The export happens in memory (no file, nothing downloaded) when the first query batch arrives,
and is checked against the PyTorch encoder on probe strings. A model whose pipeline is not
transformer → mean pooling → normalisation, or whose export does not match, is refused with an
error that names ``embedder.query_runtime=torch``; it never silently falls back.
"""
from __future__ import annotations

import functools
import io
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from tasks.core.progress import timed
from tasks.text.encoder import load_encoder

PROBE = ["Who directed the film that won the award in 1994?", "Paris", "the United States of America",
         "Which river flows through the capital of the country where the composer was born, and how long is it?"]
MAX_ABS_DIFF = 1e-5  # exported (fp32) vs eager embeddings, unit vectors
INT8_MIN_COSINE = 0.98  # int8 vs eager embeddings: each probe's cosine at least this (per-channel: ~0.99 here)
PRECISIONS = ("fp32", "int8")


class OnnxExportError(RuntimeError):
    """The encoder cannot be run by ONNX Runtime faithfully."""


@dataclass(frozen=True)
class OnnxEncoder:
    """An ONNX Runtime session over the transformer plus the tokenizer and pooling of the original model."""

    session: Any
    tokenizer: Any
    input_names: tuple[str, ...]
    max_length: int
    dim: int

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        """Mean-pooled, L2-normalised float32 embeddings, sub-batched by length like sentence-transformers."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            tok = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                 max_length=self.max_length, return_tensors="np")
            hidden = self.session.run(None, {n: tok[n].astype(np.int64) for n in self.input_names})[0]
            mask = tok["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
            out[idx] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return out


def _check_pipeline(enc: Any) -> None:
    """Transformer → mean Pooling → Normalize, the structure :meth:`OnnxEncoder.encode` reproduces."""
    names = [type(m).__name__ for m in enc]
    pooling = enc[1] if len(names) > 1 else None
    mode = (pooling.get_config_dict().get("pooling_mode") if hasattr(pooling, "get_config_dict")  # ST >= 5
            else pooling.get_pooling_mode_str() if hasattr(pooling, "get_pooling_mode_str") else None)
    if names[:1] != ["Transformer"] or mode != "mean" or "Normalize" not in names[2:]:
        raise OnnxExportError(f"embedder.query_runtime=onnxruntime supports transformer + mean pooling + "
                              f"normalise models; this one is {names} (pooling {mode!r}). Set "
                              f"embedder.query_runtime=torch.")


def _export(model: Any, tokenizer: Any) -> tuple[bytes, tuple[str, ...]]:
    """The transformer as ONNX bytes (dynamic batch and sequence axes) and its input names."""
    import torch

    sample = tokenizer(PROBE[:2], padding=True, return_tensors="pt")
    names = tuple(n for n in ("input_ids", "attention_mask", "token_type_ids") if n in sample)

    class LastHidden(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any) -> Any:
            return self.inner(**dict(zip(names, args))).last_hidden_state

    buf = io.BytesIO()
    axes = {n: {0: "batch", 1: "seq"} for n in (*names, "hidden")}
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHidden(model.eval()), tuple(sample[n] for n in names), buf, input_names=list(names),
                          output_names=["hidden"], dynamic_axes=axes, opset_version=17, dynamo=False)
    return buf.getvalue(), names


def _quantised(blob: bytes) -> bytes:
    """The ONNX model with its MatMul weights quantised to int8 per output channel (activations: dynamically).

    Per-channel scales matter: one scale per tensor puts MiniLM's embeddings at cosine 0.94 of the eager ones.
    """
    import logging
    import tempfile
    from pathlib import Path

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        src.write_bytes(blob)
        root, level = logging.getLogger(), logging.getLogger().level
        root.setLevel(logging.ERROR)  # its advice to pre-process the model first goes to the root logger
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=True,
                                 op_types_to_quantize=["MatMul"])
        finally:
            root.setLevel(level)
        return dst.read_bytes()


@functools.lru_cache(maxsize=4)
def load_onnx_encoder(model: str, max_seq_length: int, threads: int, precision: str = "fp32") -> OnnxEncoder:
    """Export ``model``'s transformer once per process (int8: quantised) and check it against the eager encoder."""
    import onnxruntime as ort

    if precision not in PRECISIONS:
        raise ValueError(f"embedder.precision must be one of {PRECISIONS}, got {precision!r}")
    enc = load_encoder(model, max_seq_length, "cpu")
    _check_pipeline(enc)
    with timed(f"exporting {model} to ONNX Runtime ({precision})"):
        blob, names = _export(enc[0].auto_model, enc.tokenizer)
        if precision == "int8":
            blob = _quantised(blob)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])
        out = OnnxEncoder(session, enc.tokenizer, names, enc.max_seq_length,
                          getattr(enc, "get_embedding_dimension", enc.get_sentence_embedding_dimension)())
        eager = enc.encode(PROBE, normalize_embeddings=True, convert_to_numpy=True)
        got = out.encode(PROBE, 2)
    if precision == "int8":
        cosine = float((got * eager).sum(axis=1).min())
        if cosine < INT8_MIN_COSINE:
            raise OnnxExportError(f"the int8 ONNX encoder of {model!r} is too far from the PyTorch encoder (cosine "
                                  f"{cosine:.3f} < {INT8_MIN_COSINE}); set embedder.precision=fp32")
        return out
    diff = float(np.abs(got - eager).max())
    if diff > MAX_ABS_DIFF:
        raise OnnxExportError(f"the ONNX export of {model!r} differs from the PyTorch encoder by {diff:.2g} "
                              f"(> {MAX_ABS_DIFF}); set embedder.query_runtime=torch and embedder.doc_runtime=torch")
    return out
