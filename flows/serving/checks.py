"""What ``dagrag query`` and ``dagrag serve`` check before they open an index (beside :mod:`flows.runtime.preflight`'s
checks of every command)."""
from __future__ import annotations

from pathlib import Path

from flows.runtime.config import Config
from flows.runtime.preflight import check_llm, check_models


def preflight_serving(conf: Config, command: str) -> None:
    """``dagrag query`` (no file) and ``dagrag serve``: the models and the LLM endpoint when answers are asked for.
    Whether the index is built is answered by opening it next (:func:`flows.serving.index.open_index`), once."""
    check_models(conf)
    check_llm(conf, command)


def check_serving(conf: Config, command: str, overrides: list[str]) -> None:
    """Before a query flow run: the questions file parses, and the index is built (unless ``query.build=true``):
    a missing one is refused with the ``dagrag index …`` command that builds it (:class:`flows.runtime.preflight.IndexNotBuilt`)."""
    from flows.serving.index import resolve

    if command == "query" and conf.query.file:
        from tasks.data.ingest import read_user_questions

        read_user_questions(Path(conf.query.file))
    if not (command == "query" and conf.query.build):
        resolve(conf, overrides)
