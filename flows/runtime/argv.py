"""What a command line holds besides Hydra overrides: the questions ``dagrag query`` takes after ``--``."""
from __future__ import annotations

SEPARATOR = "--"  # dagrag query: the questions follow it, one per argument, as typed


def split_questions(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``dagrag query`` arguments → (overrides, the questions after ``--``, or None when there is no ``--``)."""
    if SEPARATOR not in argv:
        return list(argv), None
    at = argv.index(SEPARATOR)
    return list(argv[:at]), list(argv[at + 1:])


def flow_run_query(args: list[str]) -> bool:
    """Whether ``dagrag query args`` is a flow run (``query.file`` names a questions file): it needs Prefect's API."""
    return any(o.startswith("query.file=") and o.split("=", 1)[1] not in ("", "null")
               for o in split_questions(args)[0])
