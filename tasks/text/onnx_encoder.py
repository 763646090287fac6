"""Online query encoding with ONNX Runtime: the same sentence-transformers weights, exported once per machine.

On this 2-core box ONNX Runtime runs MiniLM on short questions about 1.35x faster than PyTorch eager
(3.3 vs 4.5 ms per question at batch 256, sub-batches of 16), with embeddings equal to 2e-7. Questions
use it by default (``embedder.query_runtime``); stored embeddings when ``embedder.doc_runtime=onnxruntime``.

``embedder.precision=int8`` (beyond the paper, approximate) quantises the exported transformer's weights to
int8 (ONNX Runtime dynamic quantisation), but for the kinds of products ``embedder.int8_keep_fp32`` names; it is
checked by cosine to the eager encoder, not to 1e-5. Its activations get one scale per batch, so an int8
embedding depends on the texts batched with it (fp32's does not).

The export happens when the first query batch arrives (nothing downloaded), and is checked against
the PyTorch encoder on probe strings. A model whose pipeline is not transformer → mean pooling →
normalisation, or whose export does not match, is refused with an error that names
``embedder.query_runtime=torch``; it never silently falls back.

The exported model is kept in a model cache (``$DAGRAG_MODEL_CACHE``, default
``$XDG_CACHE_HOME/dagrag/models`` or ``~/.cache/dagrag/models``; ``off`` disables it), keyed by the model's
files (name, size, mtime), the versions of torch, transformers and onnxruntime, this module's code,
the precision (with int8's fp32 kinds) and ``max_seq_length``. Next to it lie the PyTorch encoder's embeddings
of the probe strings.
A later process loads the file and its tokenizer (the ``tokenizers`` library: no torch import, no export,
about 2-4 s less per process) and checks the loaded encoder against those stored PyTorch embeddings with
the same rule as a fresh export; an entry that fails the check or cannot be read is exported again.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from tasks.core.progress import timed
from tasks.text.encoder import load_encoder, model_path

log = logging.getLogger("dagrag")

PROBE = ["Who directed the film that won the award in 1994?", "Paris", "the United States of America",
         "Which river flows through the capital of the country where the composer was born, and how long is it?"]
MAX_ABS_DIFF = 1e-5  # exported (fp32) vs eager embeddings, unit vectors
INT8_MIN_COSINE = 0.98  # int8 vs eager embeddings: each probe's cosine at least this (per-channel: ~0.99 here)
PRECISIONS = ("fp32", "int8")
# the weight products int8 may leave in fp32 (``embedder.int8_keep_fp32``), by the BERT export's node names
INT8_KINDS = {
    "query": r"/attention/self/query/MatMul$",
    "key": r"/attention/self/key/MatMul$",
    "value": r"/attention/self/value/MatMul$",
    "attention_output": r"/attention/output/dense/MatMul$",
    "ffn_in": r"/intermediate/dense/MatMul$",
    "ffn_out": r"/layer\.\d+/output/dense/MatMul$",
}


class OnnxExportError(RuntimeError):
    """The encoder cannot be run by ONNX Runtime faithfully."""


Tokenize = Callable[[list[str]], dict[str, np.ndarray]]


# A text is tokenised from its head (beyond the paper, an engineering choice that changes no id; issue 58): the
# first ``max_length * HEAD_CHARS_PER_TOKEN`` characters, cut where a word ends, widened HEAD_WIDEN-fold while
# they give fewer than ``max_length`` tokens. Whole, a 375 KB text was 124,386 tokens for 256 kept (docs/embeddings.md).
HEAD_CHARS_PER_TOKEN = 8
HEAD_WIDEN = 4
_WORD_END = re.compile(r"(?<=\S)\s")


def head(text: str, chars: int) -> str:
    """``text`` up to the first word end at or after ``chars`` characters (the whole text if there is none).

    The cut falls between a non-space and a space, where every pre-tokeniser of the ``tokenizers`` library
    (BERT's, whitespace, metaspace, byte-level) ends a pre-token, and the usual normalisers (BERT's, lower case,
    Unicode forms) act per character and its combining marks, so the head's tokens are the whole text's first ones.
    """
    if len(text) <= chars:
        return text
    end = _WORD_END.search(text, max(chars, 1))
    return text if end is None else text[:end.start()]


@functools.lru_cache(maxsize=4)
def _truncating_tokenizer(folder: str, max_length: int) -> Any:
    """``tokenizer.json`` truncating at ``max_length`` (None: no file, or no pre-tokeniser, where no cut is safe)."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_length)
    tok.no_padding()
    return tok if tok.pre_tokenizer is not None else None


def embedded_heads(texts: list[str], folder: str, max_length: int) -> list[str]:
    """Each text cut to the :func:`head` that holds every token the encoder embeds (its first ``max_length``,
    special tokens included): the head, widened while it gives fewer, as :func:`fast_tokenizer` reads texts. For
    an encoder that tokenises its input whole (sentence-transformers on torch), so that a 375 KB text costs the
    tokens it embeds, not 124,386. Texts unchanged where the model has no ``tokenizer.json`` with a
    pre-tokeniser."""
    tok = _truncating_tokenizer(folder, max_length)
    if tok is None:
        return list(texts)
    chars = max_length * HEAD_CHARS_PER_TOKEN
    heads = [head(t, chars) for t in texts]
    cut = [i for i, t in enumerate(texts) if len(heads[i]) < len(t)]
    while cut:
        full = tok.encode_batch([heads[i] for i in cut])
        cut = [i for i, e in zip(cut, full) if len(e.ids) < max_length]
        chars *= HEAD_WIDEN
        for i in cut:
            heads[i] = head(texts[i], chars)
        cut = [i for i in cut if len(heads[i]) < len(texts[i])]
    return heads


def fast_tokenizer(folder: Path, max_length: int) -> Tokenize | None:
    """The model's ``tokenizer.json`` through the ``tokenizers`` library (truncated at ``max_length``, padded
    to the longest text), the same ids sentence-transformers' tokenizer gives; None when the folder has none.

    A long text is tokenised from its :func:`head` only: a head that fills ``max_length`` tokens gives the whole
    text's ids; one that does not is widened, up to the whole text. A tokenizer without a pre-tokeniser (one
    piece per text, where no cut is safe) reads whole texts.
    """
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_length)
    pad = tok.padding or {}
    pad_id, pad_type_id = pad.get("pad_id", 0), pad.get("pad_type_id", 0)
    tok.no_padding()  # padded here, to the longest of the batch, after heads are widened
    window = max_length * HEAD_CHARS_PER_TOKEN if tok.pre_tokenizer is not None else None

    def tokenize(texts: list[str]) -> dict[str, np.ndarray]:
        heads = list(texts) if window is None else [head(t, window) for t in texts]
        enc, chars = tok.encode_batch(heads), window
        while short := [i for i, t in enumerate(texts) if len(enc[i].ids) < max_length and len(heads[i]) < len(t)]:
            chars *= HEAD_WIDEN
            for i in short:
                heads[i] = head(texts[i], chars)
            for i, e in zip(short, tok.encode_batch([heads[i] for i in short])):
                enc[i] = e
        return padded(enc, pad_id, pad_type_id)

    return tokenize


def padded(encodings: list[Any], pad_id: int, pad_type_id: int) -> dict[str, np.ndarray]:
    """``tokenizers`` encodings as right-padded (n, longest) arrays, as the library's own padding makes them."""
    width = max((len(e.ids) for e in encodings), default=0)
    out = {"input_ids": np.full((len(encodings), width), pad_id, dtype=np.int64),
           "attention_mask": np.zeros((len(encodings), width), dtype=np.int64),
           "token_type_ids": np.full((len(encodings), width), pad_type_id, dtype=np.int64)}
    for row, e in enumerate(encodings):
        n = len(e.ids)
        out["input_ids"][row, :n] = e.ids
        out["attention_mask"][row, :n] = e.attention_mask
        out["token_type_ids"][row, :n] = e.type_ids
    return out


def hf_tokenizer(tokenizer: Any, max_length: int) -> Tokenize:
    """The eager model's own (transformers) tokenizer as a :data:`Tokenize`."""
    def tokenize(texts: list[str]) -> dict[str, np.ndarray]:
        tok = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="np")
        return {k: np.asarray(v, dtype=np.int64) for k, v in tok.items()}

    return tokenize


@dataclass(frozen=True)
class OnnxEncoder:
    """An ONNX Runtime session over the transformer plus the tokenizer and pooling of the original model."""

    session: Any
    tokenize: Tokenize
    input_names: tuple[str, ...]
    dim: int

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        """Mean-pooled, L2-normalised float32 embeddings, sub-batched by token count, longest first.

        All texts are tokenised in one call; each sub-batch then holds texts of nearly equal token counts and is
        cut to its own longest (padding is on the right), so it pads less than sorting by characters did (2Wiki
        questions: 2.6 against 3.0 ms each at sub-batches of 16). Padding does not change a text's embedding.
        """
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        tok = self.tokenize(texts)
        lengths = tok["attention_mask"].sum(axis=1)
        if not ((tok["attention_mask"][:, 0] == 1) | (lengths == 0)).all():
            raise OnnxExportError("the tokenizer pads on the left; OnnxEncoder cuts padding on the right")
        order = np.argsort(-lengths, kind="stable")
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            width = max(int(lengths[idx[0]]), 1)
            feed = {n: np.ascontiguousarray(tok[n][idx, :width]) for n in self.input_names}
            hidden = self.session.run(None, feed)[0]
            mask = tok["attention_mask"][idx, :width, None].astype(np.float32)
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
    """The transformer as ONNX bytes (dynamic batch and sequence axes) and its input names.

    It is traced with the model's plain ("eager") attention, softmax of the masked scores, not PyTorch's fused
    ``scaled_dot_product_attention``: exported, the fused kernel becomes a chain of elementwise guards over every
    (batch, head, query, key) score (``IsNaN``, ``Where``) that ONNX Runtime runs one by one. The same sums
    otherwise: the 2Wiki passages' stage took 118 instead of 146 s (README, Attention in the export); texts of
    a few tokens gain nothing. The model's own setting is restored after the trace.
    """
    with _eager_attention(model):
        return _trace(model, tokenizer)


@contextlib.contextmanager
def _eager_attention(model: Any) -> Iterator[None]:
    """``model`` with eager attention for the duration (a transformers model without the switch: unchanged)."""
    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    switch = getattr(model, "set_attn_implementation", None)
    if switch is None or before in (None, "eager"):
        yield
        return
    switch("eager")
    try:
        yield
    finally:
        switch(before)


def _trace(model: Any, tokenizer: Any) -> tuple[bytes, tuple[str, ...]]:
    """``torch.onnx.export`` of the transformer's last hidden state, and its input names."""
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


def int8_kept(precision: str, keep_fp32: tuple[str, ...]) -> tuple[str, ...]:
    """The kinds that stay fp32, sorted and each once: ``keep_fp32`` under int8, none under fp32 (all is fp32
    there). A kind :data:`INT8_KINDS` does not know is refused."""
    unknown = sorted(set(keep_fp32) - set(INT8_KINDS))
    if unknown:
        raise ValueError(f"embedder.int8_keep_fp32 takes kinds of {sorted(INT8_KINDS)}, got {unknown}")
    return tuple(sorted(set(keep_fp32))) if precision == "int8" else ()


def int8_excluded(node_names: list[str], keep_fp32: tuple[str, ...]) -> list[str]:
    """The MatMul nodes of the kinds in ``keep_fp32`` (:data:`INT8_KINDS`); a kind that names none is an error."""
    out = []
    for kind in keep_fp32:
        hits = [n for n in node_names if re.search(INT8_KINDS[kind], n)]
        if not hits:
            raise OnnxExportError(f"embedder.int8_keep_fp32 names {kind!r}, but the exported model has no such "
                                  f"product (its MatMuls: {node_names[:4]}...); leave it out of the list")
        out += hits
    return out


def _quantised(blob: bytes, keep_fp32: tuple[str, ...] = ()) -> bytes:
    """The ONNX model with its MatMul weights quantised to int8 per output channel (activations: dynamically),
    except the products of the kinds in ``keep_fp32``, which stay fp32.

    Per-channel scales matter: one scale per tensor puts MiniLM's embeddings at cosine 0.94 of the eager ones.
    """
    import logging
    import tempfile
    from pathlib import Path

    import onnx

    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        src.write_bytes(blob)
        names = [n.name for n in onnx.load_from_string(blob).graph.node if n.op_type == "MatMul"]
        excluded = int8_excluded(names, keep_fp32)
        root, level = logging.getLogger(), logging.getLogger().level
        root.setLevel(logging.ERROR)  # its advice to pre-process the model first goes to the root logger
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=True,
                                 op_types_to_quantize=["MatMul"], nodes_to_exclude=excluded)
        finally:
            root.setLevel(level)
        return dst.read_bytes()


def _session(blob: bytes, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # no busy-waiting between runs: spinning workers held both cores after an encode, so the retriever's next
    # products (numpy, scipy, torch) waited for them (a batch-1 question's walk measured 2-3x slower)
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])


def _check(got: np.ndarray, eager: np.ndarray, model: str, precision: str) -> None:
    """The load check: fp32 equal to the eager encoder to ``MAX_ABS_DIFF``; int8 within ``INT8_MIN_COSINE``."""
    if precision == "int8":
        cosine = float((got * eager).sum(axis=1).min())
        if cosine < INT8_MIN_COSINE:
            raise OnnxExportError(f"the int8 ONNX encoder of {model!r} is too far from the PyTorch encoder (cosine "
                                  f"{cosine:.3f} < {INT8_MIN_COSINE}); set embedder.precision=fp32")
        return
    diff = float(np.abs(got - eager).max())
    if diff > MAX_ABS_DIFF:
        raise OnnxExportError(f"the ONNX export of {model!r} differs from the PyTorch encoder by {diff:.2g} "
                              f"(> {MAX_ABS_DIFF}); set embedder.query_runtime=torch and embedder.doc_runtime=torch")


def model_cache_root() -> Path | None:
    """Where exported encoders are kept (``$DAGRAG_MODEL_CACHE``; ``off``: nowhere)."""
    env = os.environ.get("DAGRAG_MODEL_CACHE", "").strip()
    if env.lower() in ("off", "0", "none", "false"):
        return None
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dagrag" / "models"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def export_key(folder: Path, max_seq_length: int, precision: str, keep_fp32: tuple[str, ...] = ()) -> str:
    """What an exported encoder depends on: the model's files, the exporting libraries, this code, the settings."""
    from tasks.core.code_identity import code_version

    files = sorted((str(f.relative_to(folder)), f.stat().st_size, f.stat().st_mtime_ns)
                   for f in folder.rglob("*") if f.is_file())
    ident = {"folder": str(folder.resolve()), "files": files, "max_seq_length": max_seq_length, "precision": precision,
             **({"keep_fp32": list(keep_fp32)} if keep_fp32 else {}),  # as int8_kept gives them
             "versions": [_version(p) for p in ("torch", "transformers", "onnxruntime", "onnx", "tokenizers")],
             "code": code_version(_export, _quantised, fast_tokenizer, OnnxEncoder)}
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:20]


def _cached(entry: Path, folder: Path, max_seq_length: int, threads: int, model: str, precision: str
            ) -> OnnxEncoder | None:
    """The encoder stored in ``entry``, checked against its stored eager probe embeddings; None if absent or bad."""
    meta_path = entry / "meta.json"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        tokenize = fast_tokenizer(folder, max_seq_length)
        if tokenize is None:
            return None
        out = OnnxEncoder(_session((entry / "model.onnx").read_bytes(), threads), tokenize,
                          tuple(meta["input_names"]), int(meta["dim"]))
        _check(out.encode(PROBE, 2), np.asarray(meta["probe"], dtype=np.float32), model, precision)
        return out
    except Exception as err:  # noqa: BLE001 - a damaged or stale entry is exported again, and said so
        log.warning("model cache entry %s is unusable (%s); exporting again", entry, err)
        shutil.rmtree(entry, ignore_errors=True)
        return None


def _store(entry: Path, blob: bytes, names: tuple[str, ...], dim: int, eager: np.ndarray) -> None:
    """Write an entry atomically: a temporary folder beside it, renamed into place (a lost race is harmless)."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=".tmp-"))
        (tmp / "model.onnx").write_bytes(blob)
        (tmp / "meta.json").write_text(json.dumps({"input_names": list(names), "dim": dim,
                                                   "probe": eager.astype(float).tolist()}))
        try:
            os.replace(tmp, entry)
        except OSError:  # another process stored the same entry first
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as err:  # a read-only or full cache only costs the next process the export
        log.warning("cannot write the model cache at %s (%s); set DAGRAG_MODEL_CACHE to a writable folder", entry, err)


@functools.lru_cache(maxsize=4)
def load_onnx_encoder(model: str, max_seq_length: int, threads: int, precision: str = "fp32",
                      keep_fp32: tuple[str, ...] = ()) -> OnnxEncoder:
    """``model``'s transformer on ONNX Runtime (int8: quantised but for the ``keep_fp32`` kinds), checked against
    the eager encoder: from the model cache when an entry exists (see the module docstring), else exported now and
    stored there."""
    if precision not in PRECISIONS:
        raise ValueError(f"embedder.precision must be one of {PRECISIONS}, got {precision!r}")
    keep_fp32 = int8_kept(precision, keep_fp32)
    folder, root = Path(model_path(model)), model_cache_root()
    entry = None
    if root is not None and folder.is_dir():
        entry = root / export_key(folder, max_seq_length, precision, keep_fp32)
    if entry is not None:
        with timed(f"loading the ONNX Runtime encoder ({precision}) from the model cache"):
            out = _cached(entry, folder, max_seq_length, threads, model, precision)
        if out is not None:
            return out
    enc = load_encoder(model, max_seq_length, "cpu")
    _check_pipeline(enc)
    with timed(f"exporting {model} to ONNX Runtime ({precision})"):
        blob, names = _export(enc[0].auto_model, enc.tokenizer)
        if precision == "int8":
            blob = _quantised(blob, keep_fp32)
        tokenize = fast_tokenizer(folder, enc.max_seq_length) if folder.is_dir() else None
        out = OnnxEncoder(_session(blob, threads), tokenize or hf_tokenizer(enc.tokenizer, enc.max_seq_length), names,
                          getattr(enc, "get_embedding_dimension", enc.get_sentence_embedding_dimension)())
        eager = enc.encode(PROBE, normalize_embeddings=True, convert_to_numpy=True)
        _check(out.encode(PROBE, 2), eager, model, precision)
    if entry is not None and tokenize is not None:
        _store(entry, blob, names, out.dim, eager)
    return out

