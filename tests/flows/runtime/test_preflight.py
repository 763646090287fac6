"""Preflight: every user error is found before any stage runs, and a command ends on it with exit status 2,
one line on stderr, and nothing written."""
from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from flows.runtime.config import load_config
from flows.commands.evaluate import evaluate_flow
from flows.runtime.preflight import (
    PreflightError,
    check_dataset,
    check_llm,
    check_models,
    llm_uses,
)
from tasks.data.ingest import IngestError
from tasks.data.sample import generate_sample
from tasks.core.store import Store
from tasks.llm.params import LLMRequestError
from tests.flows.conftest import make_config
from tests.llm_server import FakeLLMServer

REPO = Path(__file__).resolve().parents[3]
SMALL = ["dataset=sample", "dataset.n_passages=40", "dataset.n_questions=6"]


def write_dataset(data: Path, name: str, corpus: list, questions: list | None = None) -> None:
    (data / name).mkdir(parents=True, exist_ok=True)
    (data / name / "corpus.json").write_text(json.dumps(corpus))
    if questions is not None:
        (data / name / "questions.json").write_text(json.dumps(questions))


def conf_of(tmp_path: Path, *overrides: str):
    return load_config(make_config(tmp_path, *overrides))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ModelsServer:
    """An endpoint whose ``GET /v1/models`` answers with a fixed status and body."""

    def __init__(self, status: int, body: dict) -> None:
        payload = json.dumps(body).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> "ModelsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---- the checks, one at a time ----------------------------------------------------------------------------

def test_a_malformed_corpus_is_named_before_any_stage(tmp_path):
    data = tmp_path / "data"
    write_dataset(data, "bad", [{"title": "A", "text": "x"}, {"title": "B"}])
    conf = conf_of(tmp_path, "method=dense", "dataset=hipporag", "dataset.name=bad", f"data_dir={data}")
    with pytest.raises(IngestError, match=r"corpus.json, record 1, field 'text': missing"):
        check_dataset(conf, "index")


def test_questions_where_the_command_needs_them(tmp_path):
    corpus, questions = generate_sample(20, 3, seed=1)
    data = tmp_path / "data"
    write_dataset(data, "corpus-only", corpus)
    write_dataset(data, "with-q", corpus, questions)
    base = ["method=bm25", "dataset=hipporag", "dataset.name=corpus-only", f"data_dir={data}"]
    conf = conf_of(tmp_path, *base)
    check_dataset(conf, "index")  # indexing needs no questions
    check_dataset(conf, "update")
    with pytest.raises(PreflightError, match=r"dataset 'corpus-only' has no questions, and flows.commands.evaluate"):
        check_dataset(conf, "evaluate")
    with pytest.raises(PreflightError, match=r"has no questions: set benchmark.questions_from=NAME"):
        check_dataset(conf, "benchmark")
    check_dataset(conf_of(tmp_path, *base, "benchmark.questions_from=with-q"), "benchmark")
    with pytest.raises(PreflightError, match=r"benchmark.questions_from=.nowhere. .*nowhere/questions.json: file not found"):
        check_dataset(conf_of(tmp_path, *base, "benchmark.questions_from=nowhere"), "benchmark")
    check_dataset(conf_of(tmp_path, *SMALL), "evaluate")  # the generated sample has questions
    with pytest.raises(PreflightError, match="has no questions"):
        check_dataset(conf_of(tmp_path, "dataset=sample", "dataset.n_questions=0"), "evaluate")


def test_model_packages_the_run_loads(tmp_path):
    check_models(conf_of(tmp_path, "method=zoomrag"))  # the packaged MiniLM and spaCy pipeline are installed
    with pytest.raises(PreflightError, match=r"ner.model='xx_no_such_pipeline' is not an installed spaCy"):
        check_models(conf_of(tmp_path, "method=zoomrag", "ner.model=xx_no_such_pipeline"))
    check_models(conf_of(tmp_path, "method=dense", "ner.model=xx_no_such_pipeline"))  # dense runs no NER
    with pytest.raises(PreflightError, match=r"embedder.model='\./no-such-model': no such folder"):
        check_models(conf_of(tmp_path, "method=dense", "embedder.model=./no-such-model"))
    check_models(conf_of(tmp_path, "method=bm25", "embedder.model=./no-such-model"))  # bm25 embeds nothing


def test_when_a_run_calls_the_llm(tmp_path):
    local = ["llm=local", "llm.base_url=http://127.0.0.1:1/v1"]
    assert llm_uses(conf_of(tmp_path, "method=dense"), "evaluate") == []  # llm=none
    assert llm_uses(conf_of(tmp_path, "method=dense", *local), "evaluate") == ["eval.generate=true"]
    assert llm_uses(conf_of(tmp_path, "method=dense", *local), "index") == []
    assert llm_uses(conf_of(tmp_path, "method=dense", *local, "eval.llm_dry_run=true"), "evaluate") == []
    assert llm_uses(conf_of(tmp_path, "method=zoomrag", "ner=llm", *local, "eval.generate=false"),
                    "index") == ["ner=llm"]
    assert llm_uses(conf_of(tmp_path, "method=erarag", *local), "index") == ["method.summariser=auto"]
    assert llm_uses(conf_of(tmp_path, "method=archrag", "kg=llm", "method.summariser=extractive", *local),
                    "update") == ["kg=llm"]
    assert llm_uses(conf_of(tmp_path, "method=serag", *local), "benchmark") == ["method.self_query=true"]


def test_the_llm_endpoint_answers_or_the_run_stops(tmp_path, caplog):
    port = free_port()
    conf = conf_of(tmp_path, "method=dense", "llm=local", f"llm.base_url=http://127.0.0.1:{port}/v1")
    with pytest.raises(PreflightError, match=rf"LLM endpoint http://127.0.0.1:{port}/v1 does not answer "
                                             r"\(GET .*/models: .*refused\); this run needs it for eval.generate"):
        check_llm(conf, "evaluate")
    check_llm(conf, "index")  # dense indexing never calls it
    with FakeLLMServer() as server:  # serves chat only: any HTTP answer shows the server is up
        check_llm(conf_of(tmp_path, "method=dense", "llm=local", f"llm.base_url={server.base_url}"), "evaluate")
        assert server.requests == 0  # no chat request was spent
    with ModelsServer(401, {"error": "bad key"}) as server:
        with pytest.raises(PreflightError, match=r"refused the API key \(HTTP 401"):
            check_llm(conf_of(tmp_path, "method=dense", "llm=local", f"llm.base_url={server.base_url}"), "evaluate")
    with ModelsServer(200, {"data": [{"id": "other-model"}]}) as server, caplog.at_level(logging.WARNING, "dagrag"):
        check_llm(conf_of(tmp_path, "method=dense", "llm=local", f"llm.base_url={server.base_url}",
                          "llm.model=wanted"), "evaluate")
        assert "llm.model='wanted' is not among the models" in caplog.text and "other-model" in caplog.text


def test_a_failed_generation_call_is_in_the_ledger(tmp_path):
    with FakeLLMServer() as server:
        cfg = make_config(tmp_path, "method=dense", *SMALL, "llm=local", f"llm.base_url={server.base_url}",
                          "llm.max_retries=0", "llm.concurrency=1")
        server.script("bad_request", 1)
        with pytest.raises(LLMRequestError):
            evaluate_flow(cfg, str(tmp_path / "r"))
    ledger = Store(tmp_path / "artifacts").query("SELECT * FROM llm_ledger WHERE stage = 'generate'")
    assert len(ledger) == 1 and ledger["llm_calls"][0] <= 5  # the row is written although generation failed


# ---- a command on a user error: exit status 2, one line, nothing written -----------------------------------

def _cases(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    data = tmp_path / "data"
    write_dataset(data, "bad", [{"title": "A", "text": "x"}, {"title": "B"}])
    write_dataset(data, "corpus-only", [{"title": "A", "text": "x"}])
    port = free_port()
    return {
        "type": (["flows.commands.evaluate", "method.alpha=abc"], "error: method.alpha='abc' is not a float in [0, 1]"),
        "malformed": (["flows.commands.index", "dataset=hipporag", "dataset.name=bad", f"data_dir={data}", "verbose=true"],
                      f"error: {data / 'bad' / 'corpus.json'}, record 1, field 'text': missing"),
        "no_questions": (["flows.commands.benchmark", "method=bm25", "dataset=hipporag", "dataset.name=corpus-only",
                          f"data_dir={data}"],
                         "error: dataset 'corpus-only' has no questions: set benchmark.questions_from=NAME"),
        "llm": (["flows.commands.evaluate", "method=bm25", "llm=local", f"llm.base_url=http://127.0.0.1:{port}/v1"],
                f"error: LLM endpoint http://127.0.0.1:{port}/v1 does not answer"),
        "questions_from": (["flows.commands.benchmark", "method=bm25", "dataset=hipporag", "dataset.name=corpus-only",
                            f"data_dir={data}", "benchmark.questions_from=nope"],
                           f"error: benchmark.questions_from='nope' (under data_dir={data}): "
                           f"{data / 'nope' / 'questions.json'}: file not found"),
        "report": (["flows.commands.report"], f"error: no catalog at {tmp_path / 'artifacts' / 'catalog.duckdb'}"),
        "scheduler": (["flows.commands.index", "method=bm25", "runner=dask", f"runner.address=tcp://127.0.0.1:{port}"],
                      f"error: runner.address='tcp://127.0.0.1:{port}': no Dask scheduler answers there"),
    }


@pytest.mark.parametrize("case", ["type", "malformed", "no_questions", "questions_from", "llm", "report",
                                  "scheduler"])
def test_a_user_error_exits_2_with_one_line_and_writes_nothing(tmp_path, case):
    args, expected = _cases(tmp_path)[case]
    artifacts = tmp_path / "artifacts"
    out = subprocess.run([sys.executable, "-m", *args, f"artifacts_dir={artifacts}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert lines[-1].startswith(expected), lines[-1]
    if case == "malformed":  # verbose=true: the traceback comes first
        assert "Traceback" in out.stderr
    else:
        assert lines == [lines[-1]] and "Traceback" not in out.stdout
    assert "temporary server" not in out.stdout + out.stderr  # the flow (and Prefect) never started
    assert [p for p in artifacts.rglob("*") if not p.is_dir()] == []  # no catalog.duckdb, no run folder files
    assert not (artifacts / "runs").exists() and not (artifacts / "catalog.duckdb").exists()


def test_a_report_of_runs_the_catalog_lacks_exits_2_and_writes_nothing(tmp_path):
    """A report.runs id (the README's placeholder, typed as is) that no evaluate run has: one line, status 2,
    no report folder and no run folder, the catalog as it was."""
    from tests.flows.small_catalog import build_small_catalog

    artifacts = tmp_path / "artifacts"
    build_small_catalog(artifacts)
    before = sorted(p.relative_to(artifacts) for p in artifacts.rglob("*"))
    out = subprocess.run([sys.executable, "-m", "flows.commands.report", "report.runs=[RUN_ID_1,RUN_ID_2]",
                          f"artifacts_dir={artifacts}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and out.stderr.startswith(
        "error: no evaluate runs in ") and "report.runs=['RUN_ID_1', 'RUN_ID_2']" in out.stderr
    assert "Crash" not in out.stdout
    assert sorted(p.relative_to(artifacts) for p in artifacts.rglob("*")) == before


def test_an_llm_that_fails_mid_run_ends_with_one_line_and_no_traceback(tmp_path):
    """The endpoint answers the preflight's GET /models, then fails every chat request: the run is recorded, the
    command ends with status 2 and one ``error:`` line, and Prefect's failed-task and failed-flow lines carry no
    traceback (they did, twice, about 80 lines)."""
    with FakeLLMServer() as server:
        server.script("server_error", 1000)
        out = subprocess.run([sys.executable, "-m", "flows.commands.evaluate", "method=bm25", *SMALL, "llm=local",
                              f"llm.base_url={server.base_url}", "llm.model=x", "llm.max_retries=0",
                              "llm.concurrency=1", "eval.generate=true", f"artifacts_dir={tmp_path / 'artifacts'}"],
                             cwd=REPO, capture_output=True, text=True, timeout=180)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and out.stderr.startswith("error: LLM endpoint")
    assert "Task run failed with exception" in out.stdout  # Prefect's line is there (the control) ...
    assert "Traceback" not in out.stdout + out.stderr      # ... without its traceback
    assert Store(tmp_path / "artifacts").query("SELECT status FROM runs")["status"].tolist() == ["failed"]
