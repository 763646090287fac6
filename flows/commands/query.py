"""``dagrag query [overrides] [-- QUESTION ...]``: ranked passages for your own questions from a built index.

The overrides are the ones that built the index (``method=…``, ``dataset=…``, ``experiment=…``, ``artifacts_dir=…``);
the index is opened, never built, unless ``query.build=true`` (:mod:`flows.serving.index`). Questions come from

* the arguments after ``--``, one question each, as typed: spaces, quotes, ``=`` and any letters need no Hydra
  quoting (``dagrag query method=bm25 -- "Who wrote 'Dune'?" "x = y?"``);
* ``query.text=…`` (one question, Hydra's quoting rules);
* stdin, one question per line, when neither is given;
* ``query.file=PATH`` (plain lines, JSONL with a ``question`` field, or a HippoRAG JSON list with or without
  gold): then the command is a flow run like ``evaluate`` (it shows in the Prefect UI, and ``conf/schedule.yaml``
  can run it nightly) and writes ``hits.parquet`` (``answers.parquet`` with ``query.answer=true``) into its run
  folder; the last line is ``query: {json}``.

Without a file nothing is written and no Prefect server starts. ``query.format=jsonl`` prints one JSON object
per question (``question``, ``results``, ``trace``; ``answer`` with ``query.answer=true``).
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import hydra
import pandas as pd
from omegaconf import DictConfig
from prefect import flow

from flows.runtime.argv import flow_run_query, split_questions
from flows.runtime.config import Config, load_config
from flows.runtime.observe import RUN_END_HOOKS, untagged_tasks
from flows.runtime.output import write_json
from flows.runtime.pipeline import run_command, start_run
from flows.runtime.tables import format_table
from flows.serving.index import Index, Ranked, open_index
from tasks.data.corpus import lineage_citation
from tasks.data.ingest import read_user_questions
from tasks.core.files import write_parquet
from tasks.core.store import Store
from tasks.eval.metrics import latency_summary

def stdin_questions() -> list[str]:
    """Questions from stdin, one per non-empty line (UTF-8; a byte that is not gives a ValueError naming it)."""
    if sys.stdin is None or sys.stdin.isatty():
        return []
    raw = sys.stdin.buffer.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise ValueError(f"stdin is not UTF-8: line {line}, byte offset {err.start}") from None
    return [ln.strip() for ln in text.split("\n") if ln.strip()]  # \n only: a U+2028 stays in its question


def batches(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start:start + size])


# ----------------------------------------------------------------------------- printing

def trace_line(trace: dict[str, Any], width: int = 200) -> str:
    """A method's trace in one line: each field, lists cut to their first three items."""
    parts = []
    for key, value in trace.items():
        if isinstance(value, list):
            head = ", ".join(_short(v) for v in value[:3])
            more = f", +{len(value) - 3}" if len(value) > 3 else ""
            parts.append(f"{key}=[{head}{more}]")
        elif isinstance(value, dict):
            parts.append(f"{key}={{{len(value)} keys}}")
        else:
            parts.append(f"{key}={_short(value)}")
    line = "; ".join(parts)
    return line if len(line) <= width else line[:width - 1] + "…"


def _short(value: Any, n: int = 40) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else " ".join(str(value).split())
    return visible(text if len(text) <= n else text[:n - 1] + "…")


# C0 and C1 control characters (ESC, BEL, NUL, DEL, CSI …): a terminal acts on them instead of showing them
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with every control character written as its escape (ESC → ``\\x1b``), so a passage cannot recolour,
    ring or clear the terminal (the human format only; JSONL keeps the text exact)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def snippet(text: str, n: int) -> str:
    flat = " ".join(text.split())
    return visible(flat if len(flat) <= n else flat[:max(n - 1, 0)] + "…")


def cited(title: str, lineage: dict | None, title_chars: int = 100) -> str:
    """A passage's label: its citation (``guide.md § Install › Linux``, ``report.pdf p. 12``) when it comes from a
    file, else its title (:func:`tasks.data.corpus.lineage_citation`); cut to ``title_chars``, control characters
    made visible."""
    return snippet(lineage_citation(lineage, title), title_chars)


def no_results_reason(question: str) -> str:
    """Why a question got no passage: nothing in it a passage can match, or no passage shares its words."""
    words = re.findall(r"\w+", question.lower())
    if not words:
        return "the question has no letters or digits (only punctuation), so there is nothing to match"
    from bm25s.stopwords import STOPWORDS_EN  # the lexical methods' stopwords (method.stopwords=en)

    if all(w in STOPWORDS_EN for w in words):
        return "the question has only stopwords, which the lexical index leaves out, so there is nothing to match"
    return "no passage shares a word with the question"


def render_text(number: int, ranked: Ranked, snippet_chars: int, answer: str | None = None,
                title_chars: int = 100) -> str:
    """The human-readable block of one question (control characters made visible, titles cut to
    ``title_chars``)."""
    lines = [f"Q{number}  {visible(ranked.question)}"]
    if answer is not None:
        lines.append(f"    answer: {visible(answer)}")
    if ranked.group == "document":
        for d in ranked.documents:
            lines.append(f"  {d['rank']:>3}  {d['score']:9.4f}  {visible(d['citation'])}")
            for p in d["passages"]:
                label = cited(p['title'], p['lineage'], title_chars)
                lines.append(f"       {p['rank']:>3}  {p['score']:9.4f}  {label}")
                if snippet_chars:
                    lines.append(f"                       {snippet(p['text'], snippet_chars)}")
    for p in ranked if ranked.group != "document" else ():
        lines.append(f"  {p.rank:>3}  {p.score:9.4f}  {cited(p.title, p.lineage, title_chars)}")
        if snippet_chars:
            lines.append(f"                  {snippet(p.text, snippet_chars)}")
    if not ranked:
        lines.append(f"    no results: {no_results_reason(ranked.question)}")
    if ranked.trace:
        lines.append(f"    trace: {trace_line(ranked.trace)}")
    return "\n".join(lines) + "\n"


def render_jsonl(ranked: Ranked, answer: Any = None) -> str:
    """One JSON line: the question, its passages and trace (and the answer, when there is one)."""
    return json.dumps((answer or ranked).to_dict(), ensure_ascii=False)


# ----------------------------------------------------------------------------- ask (no flow run)

def ask(index: Index, questions: Iterable[str], conf: Config, out: Any = None) -> int:
    """Retrieve (and answer) in batches and print each question as it is done; returns how many were asked."""
    out = out or sys.stdout
    q = conf.query
    n = 0
    for batch in batches(list(questions), q.batch_size):
        if q.answer:
            answers = index.answer(batch, q.k)
            pairs = [(a.passages, a) for a in answers]
        else:
            pairs = [(r, None) for r in index.retrieve(batch, q.k, group=q.group)]
        for ranked, answer in pairs:
            n += 1
            if q.format == "jsonl":
                out.write(render_jsonl(ranked, answer) + "\n")
                if not ranked:  # stdout stays one JSON object per question; the why on stderr
                    print(f"note: question {n} has no results: {no_results_reason(ranked.question)}",
                          file=sys.stderr)
            else:
                out.write(render_text(n, ranked, q.snippet_chars, answer.answer if answer else None,
                                      q.title_chars) + "\n")
        out.flush()
    return n


def main_interactive(overrides: list[str], questions: list[str] | None) -> int:
    """``dagrag query`` without a file: open the index, ask, print; nothing written, no Prefect server."""
    from flows.runtime.exits import USER_ERRORS, fail, verbose
    from flows.serving.index import NoLLM, compose

    cfg: dict[str, Any] = {}
    try:
        cfg = compose(overrides)
        conf = load_config(cfg)
        from flows.serving.checks import preflight_serving

        preflight_serving(conf, "query")
        asked = list(questions or []) + ([conf.query.text] if conf.query.text else [])
        if not asked:
            asked = stdin_questions()
        if not asked:
            raise ValueError("no questions: give them after `--` (dagrag query method=… -- \"your question\"), "
                             "with query.text=…, query.file=PATH, or one per line on stdin")
        index = open_index(*overrides, config=cfg, build=conf.query.build)
        ask(index, asked, conf)
    except (*USER_ERRORS, ValueError, NoLLM) as err:
        fail(err, verbose(cfg))
    return 0


# ----------------------------------------------------------------------------- a questions file: a flow run

@flow(name="query", **RUN_END_HOOKS)
@untagged_tasks
def query_flow(cfg: dict, run_dir: str) -> dict[str, Any]:
    """Answer a questions file from a built index: ``hits.parquet`` (``answers.parquet``) in the run folder."""
    from tasks.eval.retrieve import retrieve_all

    conf = load_config(cfg)
    ctx, manifest = start_run(conf, "query")
    questions = read_user_questions(Path(conf.query.file))
    index = open_index(config=cfg, build=conf.query.build)
    k = conf.query.k or index.default_k
    hits, latency, traces = retrieve_all(index.retriever, questions, k, conf.query.batch_size)
    out = Path(run_dir)
    docs = Store.read(index.data["documents"], ["doc_id", "title"])
    hits = hits.merge(docs, on="doc_id", how="left")
    write_parquet(questions, out / "questions.parquet")
    write_parquet(hits, out / "hits.parquet")
    if traces:
        write_parquet(pd.DataFrame([{k_: json.dumps(v, default=str) if isinstance(v, (list, dict)) else v
                                           for k_, v in t.items()} for t in traces]), out / "trace.parquet")
    lat = latency_summary(latency)
    summary: dict[str, Any] = {
        "method": conf.method.name, "dataset": ctx.dataset, "n_questions": len(questions), "k": k,
        "questions_file": str(Path(conf.query.file).resolve()), "query_ms_mean": lat["mean"],
        "index_fingerprint": index.info.fingerprint, "index_built_at": index.info.built_at,
        "hits": str(out / "hits.parquet"), "run_id": ctx.run_id, "overrides": manifest["overrides"]}
    if conf.query.answer:
        t0 = time.perf_counter()
        answers = index.answer(questions["question"].tolist(), k)
        table = pd.DataFrame({"qid": questions["qid"], "question": questions["question"],
                              "answer": [a.answer for a in answers], "raw": [a.raw for a in answers]})
        write_parquet(table, out / "answers.parquet")
        summary.update(answers=str(out / "answers.parquet"), answer_seconds=round(time.perf_counter() - t0, 3))
    ctx.store.record_metrics(ctx.run_id, "query", conf.method.name, ctx.dataset, summary, manifest["overrides"])
    write_json(out / "manifest.json", manifest)
    top = hits[hits["rank"] == 1].set_index("qid")["title"]
    rows = [{"qid": q, "question": _short(t, 60), "top passage": _short(top.get(q, ""), 40)}
            for q, t in zip(questions["qid"].head(10), questions["question"].head(10))]
    print(f"\n{conf.method.name} on {ctx.dataset}: {len(questions)} questions → {out / 'hits.parquet'}")
    print(format_table(rows, ["qid", "question", "top passage"]), flush=True)
    return summary


def hydra_run_dir() -> str:
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.get().runtime.output_dir


@hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
def flow_main(cfg: DictConfig) -> None:
    """Hydra entry point of a questions-file query (a flow run with a run folder)."""
    from flows.runtime.provenance import job_overrides
    from flows.serving.checks import check_serving

    overrides = [f"{k}={v}" for k, v in job_overrides().items()]
    run_command(query_flow, cfg, "query", hydra_run_dir(), check=lambda conf: check_serving(conf, "query", overrides))


def main(argv: list[str] | None = None) -> int:
    """``dagrag query``: a flow run with ``query.file``, else questions asked in this process."""
    for stream in (sys.stdout, sys.stderr):  # questions and passages in any language, whatever the locale
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(encoding="utf-8")
    overrides, questions = split_questions(sys.argv[1:] if argv is None else argv)
    if flow_run_query(overrides) or any(o.startswith("-") for o in overrides):  # a file, or Hydra's own flags
        sys.argv = [sys.argv[0], *overrides]
        flow_main()
        return 0
    return main_interactive(overrides, questions)


if __name__ == "__main__":
    sys.exit(main())
