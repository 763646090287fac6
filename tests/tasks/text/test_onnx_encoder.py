"""The ONNX Runtime query encoder equals the PyTorch one; bad set-ups are refused, not worked around."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tasks.text.embed import EmbedderParams, encode_queries


def test_onnx_queries_equal_torch_queries() -> None:
    texts = ["Who wrote Hamlet?", "Paris", "", "a much longer question " * 40,  # truncated at max_seq_length
             "Which city hosted the 1992 Summer Olympics, and who was its mayor then?"] * 7  # > one sub-batch
    onnx = encode_queries(texts, EmbedderParams(query_runtime="onnxruntime"))
    torch = encode_queries(texts, EmbedderParams(query_runtime="torch"))
    assert onnx.shape == torch.shape == (len(texts), 384) and onnx.dtype == np.float32
    np.testing.assert_allclose(onnx, torch, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(onnx, axis=1), 1.0, atol=1e-5)
    # batching does not change a text's embedding
    np.testing.assert_allclose(encode_queries(texts[:1], EmbedderParams()), onnx[:1], atol=1e-6)


def test_bad_query_runtime_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="query_runtime"):
        EmbedderParams(query_runtime="tensorrt")
    with pytest.raises(ValueError, match="query_runtime=torch"):
        replace(EmbedderParams(), device="cuda")


def test_unsupported_pipeline_names_the_fix() -> None:
    from tasks.text.onnx_encoder import OnnxExportError, _check_pipeline

    class Pool:
        def get_config_dict(self) -> dict:
            return {"pooling_mode": "cls"}

    class Transformer:
        pass

    with pytest.raises(OnnxExportError, match="query_runtime=torch"):
        _check_pipeline([Transformer(), Pool()])


PASSAGES = ["Mithridates VI of Pontus\nMithridates VI was king of Pontus in northern Anatolia from about 120 to "
            "63 BC. " * 6, "Paris\nParis is the capital of France.", "", "short"] * 20  # > one batch of 64


def test_stored_embeddings_through_onnx_runtime_equal_torch() -> None:
    from tasks.text.embed import encode_stored

    torch = encode_stored(PASSAGES, EmbedderParams())
    onnx = encode_stored(PASSAGES, EmbedderParams(doc_runtime="onnxruntime"))
    assert onnx.shape == torch.shape and onnx.dtype == np.float32
    np.testing.assert_allclose(onnx, torch, atol=1e-5)


def test_int8_encoder_is_close_but_not_equal_and_is_a_separate_cache() -> None:
    from tasks.text.embed import encode_stored

    params = EmbedderParams(doc_runtime="onnxruntime", precision="int8")
    int8 = encode_stored(PASSAGES, params)
    fp32 = encode_stored(PASSAGES, EmbedderParams())
    cosine = (int8 * fp32).sum(axis=1)
    assert cosine.min() > 0.95 and np.median(cosine) > 0.98  # close (the load check holds on its probes)
    assert np.abs(int8 - fp32).max() > 1e-4  # approximate: really quantised
    np.testing.assert_allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-5)
    assert EmbedderParams().stored_identity() == {}  # the torch rows keep their old cache
    ids = {str(p.stored_identity()) for p in (EmbedderParams(), EmbedderParams(doc_runtime="onnxruntime"), params)}
    assert len(ids) == 3


def test_bad_runtime_and_precision_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="doc_runtime"):
        EmbedderParams(doc_runtime="tensorrt")
    with pytest.raises(ValueError, match="precision"):
        EmbedderParams(precision="int4")
    with pytest.raises(ValueError, match="set embedder.doc_runtime"):
        EmbedderParams(precision="int8", query_runtime="torch")
    with pytest.raises(ValueError, match="doc_runtime=torch"):
        EmbedderParams(doc_runtime="onnxruntime", query_runtime="torch", device="cuda")
