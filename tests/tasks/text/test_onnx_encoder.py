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
