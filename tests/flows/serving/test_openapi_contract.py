"""``dagrag serve``'s OpenAPI contract holds: a contract fuzzer (schemathesis, every check) against a real server
with the API key on finds nothing; every response is typed and every error documented; a client generated from
``/openapi.json`` (datamodel-code-generator) types a real answer."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from flows.runtime.config import ServeParams
from flows.serving.app import Service
from flows.serving.index import open_index
from tests.flows.serving_helpers import ServeProcess, build_bm25, sample_questions, uvicorn_thread

KEY = "contract-key-0123456789"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def bm25(tmp_path_factory) -> list[str]:
    return build_bm25(tmp_path_factory.mktemp("contract"))


def test_a_contract_fuzzer_finds_no_failure_against_a_real_server(bm25, tmp_path):
    """schemathesis 4, all checks (server errors, schema conformance of every response, status codes and content
    types documented, schema-valid requests accepted and invalid ones refused, auth not ignored, undeclared
    methods answered 405), over a few hundred generated cases, with a fixed seed."""
    if not (BIN / "schemathesis").exists():
        pytest.skip("schemathesis is not installed: pip install -e '.[test]'")
    with ServeProcess(bm25, env={"DAGRAG_API_KEY": KEY}) as server:
        run = subprocess.run(
            [str(BIN / "schemathesis"), "run", f"{server.url}/openapi.json", "-H", f"Authorization: Bearer {KEY}",
             "--checks", "all", "--max-examples", "100", "--seed", "61", "--no-color"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path)  # its cache folder goes there
        assert server.proc.poll() is None, "the server died under the fuzzer"
    out = run.stdout + run.stderr
    cases = re.search(r"(\d+) generated, (\d+) passed", out)
    assert run.returncode == 0 and "No issues found" in out, out[-6000:]
    assert cases and int(cases.group(1)) >= 300 and cases.group(1) == cases.group(2), out[-3000:]
    print(f"schemathesis: {cases.group(0)}")


@pytest.fixture(scope="module")
def served(bm25):
    with uvicorn_thread(Service(open_index(*bm25), ServeParams(max_k=50), api_key=KEY)) as url:
        yield url


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def test_every_response_is_typed_and_every_error_documented(served):
    spec = httpx.get(f"{served}/openapi.json", headers=auth()).json()
    ops = {(path, method): op for path, item in spec["paths"].items() for method, op in item.items()}
    assert "/answer" not in spec["paths"]  # no LLM: the route is left out (it can only answer 501)
    for (path, method), op in ops.items():
        ok = op["responses"]["200"]["content"]
        if path == "/metrics":
            assert list(ok) == ["text/plain"]
        elif path == "/":
            assert list(ok) == ["text/html"]
        else:
            assert ok["application/json"]["schema"]["$ref"].startswith("#/components/schemas/"), (path, ok)
        for status, response in op["responses"].items():
            if int(status) >= 400:
                assert response["content"] == {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        assert op["security"] == ([] if path == "/health" else [{"bearer": []}])
    retrieve = ops[("/retrieve", "post")]
    assert {"400", "401", "413", "422", "503"} <= set(retrieve["responses"])
    body = retrieve["requestBody"]["content"]["application/json"]["schema"]
    one, many = body["oneOf"]
    assert one["required"] == ["question"] and many["required"] == ["questions"]
    assert one["additionalProperties"] is False and many["additionalProperties"] is False
    assert one["properties"]["k"]["maximum"] == 50 and one["properties"]["k"]["minimum"] == 1
    assert one["properties"]["question"]["maxLength"] == ServeParams().max_question_chars
    assert many["properties"]["questions"]["maxItems"] == ServeParams().max_questions
    passage = spec["components"]["schemas"]["Passage"]
    assert set(passage["required"]) == {"doc_id", "title", "text", "score", "rank"}
    assert "lineage" in passage["properties"]
    assert set(spec["components"]["schemas"]["Lineage"]["properties"]) == {
        "document", "source", "page", "headings", "span", "citation"}


def test_undeclared_methods_get_405_and_unknown_paths_a_json_404(served):
    for method, path in (("TRACE", "/admin/reload"), ("GET", "/retrieve"), ("DELETE", "/index"), ("PUT", "/")):
        reply = httpx.request(method, f"{served}{path}")  # no key: what a path allows is answered first
        assert reply.status_code == 405, (method, path, reply.text)
        assert "error" in reply.json() and reply.headers["allow"]
    missing = httpx.get(f"{served}/nowhere", headers=auth())
    assert missing.status_code == 404 and "error" in missing.json()
    assert httpx.get(f"{served}/metrics", headers=auth()).headers["content-type"].startswith("text/plain")


def test_the_schemas_rules_are_the_servers(served):
    """What the schema refuses the server refuses (422), and an integral float k is an integer to both."""
    def post(body) -> httpx.Response:  # json.dumps escapes a lone surrogate as \\ud800, as a JSON client may
        return httpx.post(f"{served}/retrieve", content=json.dumps(body).encode(), timeout=60,
                          headers={**auth(), "content-type": "application/json"})

    assert post({"question": "Who founded a guild?", "k": 3.0}).status_code == 200
    for body in ({"question": None, "questions": ["q"]}, {"question": "q", "k": None}, {"question": "\u2003\n"},
                 {"questions": ["\ud800"]}, {"question": "q", "k": 51}):
        reply = post(body)
        assert reply.status_code == 422 and reply.json()["error"], (body, reply.text)
    assert httpx.post(f"{served}/admin/reload?force=maybe", headers=auth()).status_code == 422
    kept = httpx.post(f"{served}/admin/reload?force=false", headers=auth())  # valid; this service cannot reopen
    assert kept.status_code == 501 and "reopen" in kept.json()["error"]


def test_the_answer_route_is_in_the_schema_when_an_llm_is_configured(bm25):
    from tests.llm_server import FakeLLMServer

    with FakeLLMServer() as llm:
        index = open_index(*bm25, "llm=local", f"llm.base_url={llm.base_url}")
        with uvicorn_thread(Service(index, ServeParams(), api_key=None)) as url:
            spec = httpx.get(f"{url}/openapi.json").json()
            answer = spec["paths"]["/answer"]["post"]
            assert answer["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
                "AnswerResponse")
            assert answer["security"] == []  # no key: only /admin/ needs one
            assert spec["paths"]["/admin/reload"]["post"]["security"] == [{"bearer": []}]


def test_a_client_generated_from_the_schema_types_a_real_answer(served, bm25, tmp_path):
    """datamodel-code-generator over /openapi.json: its RetrieveResponse parses a real /retrieve answer into
    typed passages (the model shown in docs/integrations.md)."""
    if not (BIN / "datamodel-codegen").exists():
        pytest.skip("datamodel-code-generator is not installed: pip install -e '.[test]'")
    (tmp_path / "openapi.json").write_text(httpx.get(f"{served}/openapi.json", headers=auth()).text)
    subprocess.run([str(BIN / "datamodel-codegen"), "--input", str(tmp_path / "openapi.json"), "--input-file-type",
                    "openapi", "--output", str(tmp_path / "models.py"), "--output-model-type",
                    "pydantic_v2.BaseModel", "--disable-timestamp", "--formatters", "builtin"],
                   check=True, capture_output=True, timeout=120)
    spec = importlib.util.spec_from_file_location("generated_models", tmp_path / "models.py")
    models = importlib.util.module_from_spec(spec)
    sys.modules["generated_models"] = models
    spec.loader.exec_module(models)
    reply = httpx.post(f"{served}/retrieve", json={"questions": sample_questions(bm25)[:3], "k": 4},
                       headers=auth(), timeout=60).json()
    typed = models.RetrieveResponse.model_validate(reply)
    first = typed.results[0][0]
    assert isinstance(first, models.Passage) and isinstance(first.score, float) and first.rank == 1
    assert isinstance(typed.index, models.IndexInfo) and typed.index.method == "bm25"
    assert [[p.doc_id for p in r] for r in typed.results] == [[p["doc_id"] for p in r] for r in reply["results"]]
    shown = re.search(r"```py\n(class Passage\(BaseModel\):.*?)```",
                      (Path(__file__).resolve().parents[3] / "docs" / "integrations.md").read_text(), re.S)
    generated = re.search(r"(class Passage\(BaseModel\):.*?)\n\n\n", (tmp_path / "models.py").read_text(), re.S)
    assert shown and generated and shown.group(1).strip() == generated.group(1).strip()


def test_the_not_blank_pattern_is_pythons_whitespace_rule():
    """The schema's pattern and the server's check are one rule: a question has a character ``str.isspace`` says
    is not whitespace (spelled out, since ``\\S`` differs between Python's re and ECMA regex)."""
    from flows.serving.schema import NOT_BLANK

    pattern = re.compile(NOT_BLANK)
    for c in map(chr, range(0x3100)):  # every whitespace character is below U+3100
        assert (pattern.search(c) is None) == c.isspace(), hex(ord(c))
