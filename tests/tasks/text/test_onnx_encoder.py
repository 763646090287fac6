"""The ONNX Runtime query encoder equals the PyTorch one; bad set-ups are refused, not worked around."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tasks.text.embed import EmbedderParams, encode_queries
from tasks.core.config_check import check_values


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


def test_sub_batches_by_token_count_give_each_text_its_own_embedding() -> None:
    from tasks.core.resources import cpu_threads
    from tasks.text.onnx_encoder import OnnxExportError, load_onnx_encoder

    p = EmbedderParams()
    enc = load_onnx_encoder(p.model, p.max_seq_length, cpu_threads(), p.precision)
    # characters and tokens disagree on the order: digits and rare words split into many word pieces
    texts = ["1234567890 0987654321 1357924680", "Who is the mother of the director of film Polish-Russian War?",
             "Xylophonists' zygomorphic quokkas", "the the the the the the the the the the", "a", "",
             "Which country is the director of the film The Clock Keeper from?"] * 3
    alone = np.stack([enc.encode([t], 1)[0] for t in texts])
    for batch_size in (1, 4, 16, 64):
        np.testing.assert_allclose(enc.encode(texts, batch_size), alone, atol=1e-6)

    def left_padded(batch: list[str]) -> dict[str, np.ndarray]:
        tok = enc.tokenize(batch)
        return {k: v[:, ::-1].copy() for k, v in tok.items()}

    with pytest.raises(OnnxExportError, match="left"):
        replace(enc, tokenize=left_padded).encode(["a", "a much longer text than the other"], 2)


def test_stored_texts_are_batched_by_token_count_not_by_characters(monkeypatch) -> None:
    from tasks.core.resources import cpu_threads
    from tasks.text import embed
    from tasks.text.onnx_encoder import load_onnx_encoder

    p = EmbedderParams(batch_size=4)
    enc = load_onnx_encoder(p.model, p.max_seq_length, cpu_threads(), p.precision)
    # long in characters but few tokens, and short in characters but many word pieces
    texts = ["the cat sat on the mat and the dog sat on the log " * 3, "1234567890 0987654321 1357924680 24681357",
             "Zygomorphic xylophonists' quokkas", "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 2,
             "Polish-Russian War (1605–1618)", "x", "Who is the mother of the director of film The Clock Keeper?",
             "Xhosa–Zulu glottochronology", "the the the the the the the the the the the the", "1, 2, 3"]
    shapes: list[tuple[int, int]] = []

    class Recording:
        def run(self, names, feed):
            shapes.append(feed["input_ids"].shape)
            return enc.session.run(names, feed)

    monkeypatch.setattr(embed, "load_onnx_encoder", lambda *a, **k: replace(enc, session=Recording()))
    got = embed.encode_onnx(texts, p)
    lengths = np.sort(enc.tokenize(texts)["attention_mask"].sum(axis=1))[::-1]
    fewest = sum(int(lengths[i]) * len(lengths[i:i + 4]) for i in range(0, len(texts), 4))
    assert sum(b * w for b, w in shapes) == fewest and max(b for b, _ in shapes) == 4
    np.testing.assert_allclose(got, np.stack([enc.encode([t], 1)[0] for t in texts]), atol=1e-6)


def _encode_beside_in_child(texts: list[str], expected: np.ndarray) -> None:
    """The forked child's check; its exit code is the verdict alone. It leaves by ``os._exit``: a fork of a
    process that has run a Prefect flow inherits Prefect's at-exit log drains, whose service state Prefect
    resets in a child, and their drain then fails an assertion (``QueueService._drain``) and sets exit code 1
    whether the check passed or not (seen when an earlier test in the same worker had run a flow)."""
    import os

    from tasks.text.embed import encode_queries_beside

    try:
        got = encode_queries_beside(texts, EmbedderParams()).result(timeout=120)
        code = 0 if np.array_equal(got, expected) else 3
    except BaseException:
        code = 4
    os._exit(code)


def test_encoding_beside_returns_encode_queries_own_embeddings_and_errors_in_a_forked_child_too() -> None:
    import multiprocessing

    from tasks.text.embed import encode_queries_beside

    texts = ["Who wrote Hamlet?", "Where was the director of Inception born?", "Paris"]
    expected = encode_queries(texts, EmbedderParams())
    np.testing.assert_array_equal(encode_queries_beside(texts, EmbedderParams()).result(timeout=120), expected)
    with pytest.raises(Exception, match="no-such-model"):  # the worker's error reaches the caller
        encode_queries_beside(texts, EmbedderParams(model="/no-such-model", query_runtime="torch")).result(timeout=120)
    # the worker thread exists in this process now; a forked child must get its own, not wait on a dead one
    child = multiprocessing.get_context("fork").Process(target=_encode_beside_in_child, args=(texts, expected))
    child.start()
    child.join(timeout=180)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0, {3: "the child's embeddings differ", 4: "the child's encode raised"}.get(
        child.exitcode, f"the child ended with {child.exitcode}")


def test_bad_query_runtime_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="query_runtime"):  # the config check, from the field's one_of metadata
        check_values(EmbedderParams, "embedder", {"query_runtime": "tensorrt"})
    with pytest.raises(ValueError, match="set embedder.query_runtime=torch embedder.doc_runtime=torch$"):
        replace(EmbedderParams(), device="cuda")  # both defaults run on ONNX Runtime: one message names both


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


@pytest.fixture(scope="module")
def fp32_stored():
    """``encode_stored(PASSAGES, EmbedderParams(doc_runtime=runtime))``: the fp32 reference embeddings the tests
    below compare against, computed once per runtime in this module (read-only copies)."""
    from tasks.text.embed import encode_stored

    done: dict[str, np.ndarray] = {}

    def get(runtime: str) -> np.ndarray:
        if runtime not in done:
            done[runtime] = encode_stored(PASSAGES, EmbedderParams(doc_runtime=runtime))
            done[runtime].setflags(write=False)
        return done[runtime]

    return get


def test_stored_embeddings_through_onnx_runtime_equal_torch(fp32_stored) -> None:
    assert EmbedderParams().doc_runtime == "onnxruntime"  # the default runtime
    torch = fp32_stored("torch")
    onnx = fp32_stored("onnxruntime")
    assert onnx.shape == torch.shape and onnx.dtype == np.float32
    np.testing.assert_allclose(onnx, torch, atol=1e-5)


def test_export_traces_plain_attention_and_gives_the_model_its_own_back() -> None:
    import onnx

    from tasks.text.encoder import load_encoder
    from tasks.text.onnx_encoder import _export

    p = EmbedderParams()
    enc = load_encoder(p.model, p.max_seq_length, "cpu")
    model = enc[0].auto_model
    before = model.config._attn_implementation
    blob, _ = _export(model, enc.tokenizer)
    assert model.config._attn_implementation == before  # the shared eager encoder is left as it was
    ops = {n.op_type for n in onnx.load_from_string(blob).graph.node}
    assert {"Softmax", "MatMul"} <= ops and "IsNaN" not in ops  # not the fused kernel's per-score guards


def test_int8_encoder_is_close_but_not_equal_and_is_a_separate_cache(fp32_stored) -> None:
    from tasks.text.embed import encode_stored

    params = EmbedderParams(doc_runtime="onnxruntime", precision="int8")
    int8 = encode_stored(PASSAGES, params)
    fp32 = fp32_stored("onnxruntime")
    cosine = (int8 * fp32).sum(axis=1)
    assert cosine.min() > 0.95 and np.median(cosine) > 0.98  # close (the load check holds on its probes)
    assert np.abs(int8 - fp32).max() > 1e-4  # approximate: really quantised
    np.testing.assert_allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-5)
    assert EmbedderParams(doc_runtime="torch").stored_identity() == {}  # torch rows keep their old cache
    ids = {str(p.stored_identity()) for p in (EmbedderParams(doc_runtime="torch"), EmbedderParams(), params)}
    assert len(ids) == 3


def test_int8_keep_fp32_names_each_kind_of_product_and_keeping_all_is_fp32(fp32_stored) -> None:
    import onnx

    from tasks.text.encoder import load_encoder
    from tasks.text.onnx_encoder import INT8_KINDS, OnnxExportError, _export, int8_excluded
    from tasks.text.embed import encode_stored

    p = EmbedderParams()
    enc = load_encoder(p.model, p.max_seq_length, "cpu")
    blob, _ = _export(enc[0].auto_model, enc.tokenizer)
    names = [n.name for n in onnx.load_from_string(blob).graph.node if n.op_type == "MatMul"]
    layers = enc[0].auto_model.config.num_hidden_layers
    picked = {kind: int8_excluded(names, (kind,)) for kind in INT8_KINDS}
    assert all(len(nodes) == layers for nodes in picked.values())  # one weight product of each kind per layer
    assert len({n for nodes in picked.values() for n in nodes}) == len(INT8_KINDS) * layers  # no overlap
    assert not any("self/MatMul" in n for nodes in picked.values() for n in nodes)  # attention's own products
    with pytest.raises(OnnxExportError, match="ffn_out"):
        int8_excluded(["/encoder/block.0/mlp/MatMul"], ("ffn_out",))
    # every weight product kept fp32: the int8 path then quantises nothing and gives the fp32 embeddings
    everything = encode_stored(PASSAGES, EmbedderParams(precision="int8", int8_keep_fp32=tuple(INT8_KINDS)))
    np.testing.assert_allclose(everything, fp32_stored("onnxruntime"), atol=1e-6)
    some = encode_stored(PASSAGES, EmbedderParams(precision="int8", int8_keep_fp32=("ffn_out",)))
    assert np.abs(some - everything).max() > 1e-4  # the others are quantised
    ids = {str(EmbedderParams(precision="int8", int8_keep_fp32=k).stored_identity())
           for k in ((), ("ffn_out",), ("ffn_out", "query"), ("query", "ffn_out", "query"))}
    assert len(ids) == 3  # the kept kinds are part of a stored row's identity, in any order
    kept = EmbedderParams(precision="int8", int8_keep_fp32=("query", "ffn_out", "query")).kept_fp32
    assert kept == ("ffn_out", "query")
    assert EmbedderParams(int8_keep_fp32=("ffn_out",)).stored_identity() == EmbedderParams().stored_identity()


@pytest.mark.parametrize("doc_runtime", ["onnxruntime", "torch"])
def test_bf16_long_texts_are_close_to_fp32_and_short_ones_are_fp32(doc_runtime: str, fp32_stored) -> None:
    from tasks.text.autocast_encoder import token_counts
    from tasks.text.embed import encode_bf16, encode_stored

    params = EmbedderParams(doc_runtime=doc_runtime, precision="bf16", bf16_min_tokens=12)
    bf16 = encode_stored(PASSAGES, params)
    fp32 = fp32_stored(doc_runtime)
    assert bf16.shape == fp32.shape and bf16.dtype == np.float32
    long = token_counts(PASSAGES, params.model, params.max_seq_length) >= 12
    assert 0 < long.sum() < len(PASSAGES)  # both paths taken
    np.testing.assert_allclose(bf16[~long], fp32[~long], atol=1e-6)  # short texts: fp32 (other batches: 1e-6)
    cosine = (bf16[long] * fp32[long]).sum(axis=1)
    assert cosine.min() > 0.999  # close (0.99997 on 2Wiki passages here)
    assert np.abs(bf16[long] - fp32[long]).max() > 1e-5  # approximate: the products really ran in bfloat16
    np.testing.assert_allclose(np.linalg.norm(bf16, axis=1), 1.0, atol=1e-5)
    # a text's path is its own: alone, each text gets (nearly, bf16 moves with padding) what it got beside others
    alone = np.stack([encode_bf16([t], params)[0] for t in PASSAGES[:8]])
    assert ((alone * bf16[:8]).sum(axis=1)).min() > 0.9999
    np.testing.assert_allclose(alone[~long[:8]], bf16[:8][~long[:8]], atol=1e-6)


def test_bf16_rows_have_their_own_cache_and_the_fp32_ones_keep_theirs() -> None:
    from tasks.text.embed import stored_code

    fp32 = (EmbedderParams(doc_runtime="torch"), EmbedderParams())
    bf16 = (EmbedderParams(doc_runtime="torch", precision="bf16"), EmbedderParams(precision="bf16"),
            EmbedderParams(precision="bf16", bf16_min_tokens=0))
    assert fp32[0].stored_identity() == {} and fp32[1].stored_identity() == {"runtime": "onnxruntime"}
    assert len({str(p.stored_identity()) for p in (*fp32, *bf16)}) == 5
    assert len({stored_code(p) for p in (*fp32, bf16[0])}) == 3
    # the threshold only matters under bf16
    assert EmbedderParams(bf16_min_tokens=7).stored_identity() == fp32[1].stored_identity()


def test_bf16_on_short_texts_only_never_imports_torch(monkeypatch) -> None:
    from tasks.text import autocast_encoder
    from tasks.text.embed import encode_stored

    def refuse(*args: object) -> None:
        raise AssertionError("the bf16 encoder was loaded for texts that all stay fp32")

    monkeypatch.setattr(autocast_encoder, "load_bf16_encoder", refuse)
    names = ["Paris", "Marie Curie", "the United States of America"]
    np.testing.assert_array_equal(encode_stored(names, EmbedderParams(precision="bf16")),
                                  encode_stored(names, EmbedderParams()))


def test_bf16_questions_stay_fp32_on_onnx_runtime() -> None:
    texts = ["Who wrote Hamlet?", "Which city hosted the 1992 Summer Olympics?"]
    np.testing.assert_array_equal(encode_queries(texts, EmbedderParams(precision="bf16")),
                                  encode_queries(texts, EmbedderParams()))


def test_bf16_that_strays_from_fp32_is_refused(monkeypatch) -> None:
    from tasks.text import autocast_encoder
    from tasks.text.onnx_encoder import OnnxExportError

    p = EmbedderParams()
    autocast_encoder.load_bf16_encoder.cache_clear()
    monkeypatch.setattr(autocast_encoder, "BF16_MIN_COSINE", 1.0 + 1e-6)  # no approximation can pass this
    try:
        with pytest.raises(OnnxExportError, match="precision=fp32"):
            autocast_encoder.load_bf16_encoder(p.model, p.max_seq_length, "cpu")
    finally:
        autocast_encoder.load_bf16_encoder.cache_clear()


@pytest.mark.parametrize("user, spin_count", [(None, "0"), ("ACTIVE", "30000000000")])
def test_bf16_imports_torch_with_passive_openmp_workers_unless_the_user_set_them(user, spin_count) -> None:
    """torch's libgomp reads OMP_WAIT_POLICY once, when it loads; OMP_DISPLAY_ENV=VERBOSE makes it print what it
    read (GOMP_SPINCOUNT: 300000 when unset, 0 passive, 3e10 active). The variable is put back afterwards."""
    import os
    import subprocess
    import sys

    script = ("import os, sys\n"
              "from tasks.text.autocast_encoder import _passive_openmp\n"
              "assert 'torch' not in sys.modules\n"
              "with _passive_openmp():\n"
              "    import torch\n"
              "print(os.environ.get('OMP_WAIT_POLICY'))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    env.update(OMP_DISPLAY_ENV="VERBOSE", **({"OMP_WAIT_POLICY": user} if user else {}))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"GOMP_SPINCOUNT = '{spin_count}'" in done.stderr
    assert done.stdout.strip() == str(user)  # unset again, or the user's own value


def test_bad_runtime_and_precision_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="doc_runtime"):  # the config check, from the fields' one_of metadata
        check_values(EmbedderParams, "embedder", {"doc_runtime": "tensorrt"})
    with pytest.raises(ValueError, match="precision"):
        check_values(EmbedderParams, "embedder", {"precision": "int4"})
    with pytest.raises(ValueError, match="int8_keep_fp32"):
        EmbedderParams(precision="int8", int8_keep_fp32=("ffn",))
    with pytest.raises(ValueError, match="set embedder.doc_runtime"):
        EmbedderParams(precision="int8", query_runtime="torch", doc_runtime="torch")
    with pytest.raises(ValueError, match="doc_runtime=torch"):
        EmbedderParams(doc_runtime="onnxruntime", query_runtime="torch", device="cuda")


def _fresh_load(monkeypatch: pytest.MonkeyPatch, cache: object, precision: str = "fp32"):
    from tasks.text.embed import EmbedderParams
    from tasks.core.resources import cpu_threads
    from tasks.text.onnx_encoder import load_onnx_encoder

    monkeypatch.setenv("DAGRAG_MODEL_CACHE", str(cache))
    load_onnx_encoder.cache_clear()
    p = EmbedderParams()
    return load_onnx_encoder(p.model, p.max_seq_length, cpu_threads(), precision)


def test_model_cache_reloads_the_same_encoder_without_torch(tmp_path, monkeypatch) -> None:
    import subprocess
    import sys

    texts = ["Who wrote Hamlet?", "Paris", "a much longer question " * 40]
    exported = _fresh_load(monkeypatch, tmp_path).encode(texts, 2)
    (entry,) = [d for d in tmp_path.iterdir() if not d.name.startswith(".")]
    assert (entry / "model.onnx").stat().st_size > 1e6 and (entry / "meta.json").is_file()
    cached = _fresh_load(monkeypatch, tmp_path)
    assert cached.encode(texts, 2).tobytes() == exported.tobytes()  # the same model file, the same numbers
    # a new process loads it without importing torch (no export, no eager model)
    code = ("import sys; from tasks.text.embed import EmbedderParams, encode_queries; "
            "e = encode_queries(['Who wrote Hamlet?'], EmbedderParams()); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(e[0, :4].tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "DAGRAG_MODEL_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    np.testing.assert_allclose(eval(out.stdout.strip().splitlines()[-1]), exported[0, :4], atol=1e-6)
    _fresh_load(monkeypatch, tmp_path, "int8")  # precision is part of the key: a second entry
    assert len([d for d in tmp_path.iterdir() if not d.name.startswith(".")]) == 2


def test_model_cache_entry_that_fails_the_check_is_exported_again(tmp_path, monkeypatch, caplog) -> None:
    import json

    good = _fresh_load(monkeypatch, tmp_path).encode(["Paris"], 1)
    (entry,) = [d for d in tmp_path.iterdir() if not d.name.startswith(".")]
    meta = json.loads((entry / "meta.json").read_text())
    meta["probe"] = [[-v for v in row] for row in meta["probe"]]  # stored eager embeddings no longer match
    (entry / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level("WARNING", logger="dagrag"):
        again = _fresh_load(monkeypatch, tmp_path).encode(["Paris"], 1)
    assert "unusable" in caplog.text
    np.testing.assert_allclose(again, good, atol=1e-6)
    assert json.loads((entry / "meta.json").read_text())["probe"][0][0] == -meta["probe"][0][0]  # rewritten
    (entry / "model.onnx").write_bytes(b"not a model")  # an unreadable file: the same
    np.testing.assert_allclose(_fresh_load(monkeypatch, tmp_path).encode(["Paris"], 1), good, atol=1e-6)


def test_model_cache_off_stores_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    _fresh_load(monkeypatch, "off")
    assert not (tmp_path / ".cache").exists()


def test_fast_tokenizer_gives_the_models_own_ids() -> None:
    from pathlib import Path

    from tasks.text.encoder import load_encoder, model_path
    from tasks.text.onnx_encoder import fast_tokenizer, hf_tokenizer

    p = EmbedderParams()
    texts = ["Who wrote Hamlet?", "", "a much longer question " * 90, "Ünïcödé café — “quotes” 東京 naïve"]
    fast = fast_tokenizer(Path(model_path(p.model)), p.max_seq_length)(texts)
    ref = hf_tokenizer(load_encoder(p.model, p.max_seq_length, "cpu").tokenizer, p.max_seq_length)(texts)
    assert fast["input_ids"].shape == (4, p.max_seq_length)  # truncated at max_seq_length, padded to the longest
    for name in ref:
        np.testing.assert_array_equal(fast[name], ref[name])


def test_masked_texts_let_the_relation_decide_which_sentence_a_question_asks_about() -> None:
    """The case the masked relation gate exists for (README, "Two levers"): with the names in, the sentence
    sharing the question's name wins; with capitalised names left out, the one stating the asked relation."""
    from tasks.text.gazetteer import Gazetteer, mask_names

    gaz = Gazetteer.of(["mudras society", "liagas studios", "gurean graimaivack"])
    question = ["In which country was the founder of Mudras Society born?"]
    sentences = ["Mudras Society has a long partnership with Liagas Studios.",
                 "It was established in 1871 by Gurean Graimaivack."]
    params = EmbedderParams()
    plain = (encode_queries(question, params) @ encode_queries(sentences, params).T).ravel()
    masked = (encode_queries(mask_names(question, gaz), params) @ encode_queries(mask_names(sentences, gaz), params).T).ravel()
    assert plain[0] > plain[1]  # the shared name decides
    assert masked[1] > masked[0]  # "founder" reads as "established by"


def _whole_text_ids(folder, max_length: int, texts: list[str]) -> dict[str, np.ndarray]:
    """The reference: every text tokenised whole by the library, then truncated and padded by it."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tok.encode_batch(texts)
    return {"input_ids": np.array([e.ids for e in enc]), "attention_mask": np.array([e.attention_mask for e in enc]),
            "token_type_ids": np.array([e.type_ids for e in enc])}


def test_long_texts_tokenised_from_their_heads_get_the_whole_texts_ids() -> None:
    from importlib import metadata
    from pathlib import Path

    from tasks.text.encoder import model_path
    from tasks.text.onnx_encoder import HEAD_CHARS_PER_TOKEN, fast_tokenizer, head

    p = EmbedderParams()
    folder, window = Path(model_path(p.model)), p.max_seq_length * HEAD_CHARS_PER_TOKEN
    # real long documents (installed packages' descriptions), and texts made to defeat a character cut
    # (the four longest installed here: which packages have long ones depends on the versions installed)
    bodies = ((d.read_text("METADATA") or "").partition("\n\n")[2] for d in metadata.distributions())
    real = sorted(bodies, key=len)[-4:]
    assert all(len(t) > 4 * window for t in real)  # each longer than its head
    overlong_words = " ".join(f"{'x' * 150}{i}" for i in range(400))  # a word over 100 characters is one [UNK]
    texts = [*real,
             "1234567890 " * 2000,  # digits: many word pieces per character
             overlong_words,  # fewer tokens than the window holds: it is widened
             "title\n" + " " * (3 * window) + "the text after a long run of spaces " * 60,
             "caf\u0065\u0301 " * (window // 3) + "na\u00efve " * 300,  # a combining accent at every cut
             "東京都" * (2 * window),  # no space at all: read whole
             "few words " + " " * (5 * window),  # only spaces after the first tokens
             "", "a", "short text"]
    got = fast_tokenizer(folder, p.max_seq_length)(texts)
    want = _whole_text_ids(folder, p.max_seq_length, texts)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert len(head(real[0], window)) < len(real[0]) and head("東京都" * 9, 4) == "東京都" * 9
    assert head("one two three", 5) == "one two" and head("one two", 3) == "one"


def test_head_tokenising_keeps_the_stored_embeddings_bit_for_bit(monkeypatch) -> None:
    from importlib import metadata

    from tasks.core.resources import cpu_threads
    from tasks.text import onnx_encoder
    from tasks.text.embed import encode_onnx

    p = EmbedderParams()
    texts = [metadata.metadata(name).get_payload() or "" for name in ("pandas", "torch")] + PASSAGES
    enc = onnx_encoder.load_onnx_encoder(p.model, p.max_seq_length, cpu_threads(), p.precision)
    headed = encode_onnx(texts, p)
    whole = onnx_encoder.hf_tokenizer(onnx_encoder.load_encoder(p.model, p.max_seq_length, "cpu").tokenizer,
                                      p.max_seq_length)
    monkeypatch.setattr("tasks.text.embed.load_onnx_encoder", lambda *a, **k: replace(enc, tokenize=whole))
    np.testing.assert_array_equal(headed, encode_onnx(texts, p))


def test_torch_path_tokenises_only_what_it_embeds(monkeypatch) -> None:
    """The torch encoder is given each long text's head (what ``max_seq_length`` keeps), as the ONNX path reads
    it: the model's own tokenizer gives the head the whole text's ids, and the embeddings equal ONNX Runtime's."""
    from importlib import metadata

    from tasks.text.embed import encode_stored
    from tasks.text.encoder import load_encoder, model_path
    from tasks.text.onnx_encoder import embedded_heads

    p = EmbedderParams(doc_runtime="torch")
    bodies = ((d.read_text("METADATA") or "").partition("\n\n")[2] for d in metadata.distributions())
    long = sorted(bodies, key=len)[-3:]
    texts = long + ["1234567890 " * 2000, " ".join(f"{'x' * 150}{i}" for i in range(400))] + PASSAGES[:4]
    heads = embedded_heads(texts, model_path(p.model), p.max_seq_length)
    assert all(len(h) < len(t) / 10 for h, t in zip(heads, long))  # the long descriptions are cut
    assert heads[-4:] == texts[-4:]  # short texts stay whole
    hf = load_encoder(p.model, p.max_seq_length, "cpu").tokenizer
    assert hf(heads, truncation=True, max_length=p.max_seq_length)["input_ids"] == \
           hf(texts, truncation=True, max_length=p.max_seq_length)["input_ids"]
    given: list[int] = []
    model = load_encoder(p.model, p.max_seq_length, "cpu")
    real = model.encode
    monkeypatch.setattr(model, "encode", lambda batch, **kw: given.extend(map(len, batch)) or real(batch, **kw))
    torch = encode_stored(texts, p)
    assert sorted(given) == sorted(map(len, heads))
    np.testing.assert_allclose(torch, encode_stored(texts, EmbedderParams()), atol=1e-5)
