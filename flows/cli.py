"""``dagrag COMMAND [hydra overrides]``: the console script (``[project.scripts]``) over the commands.

``dagrag evaluate method=bm25`` is ``python -m flows.commands.evaluate method=bm25``, run exactly as ``python -m``
would run it (the command module executes as ``__main__``, so Hydra finds ``conf/`` from its ``config_path`` and every
flag, ``-m`` sweeps and ``--cfg job`` included, means what it means there).
"""
from __future__ import annotations

import gc
import runpy
import signal
import sys
from pathlib import Path

from flows.runtime.argv import flow_run_query, split_questions

COMMANDS = {
    "evaluate": ("flows.commands.evaluate", "index (cached) → batched retrieval → recall@k, latency [, answers]"),
    "index": ("flows.commands.index", "build or update an index only"),
    "update": ("flows.commands.update", "bring an index up to date with a grown or shrunk corpus"),
    "benchmark": ("flows.commands.benchmark", "latency per query at several batch sizes, memory, per-part split"),
    "compare": ("flows.commands.compare", "every method on one dataset (shared stages computed once), then the report"),
    "scale": ("flows.commands.scale", "the scale table: every method at several sample sizes (index s, memory, ms/query, disk)"),
    "growth": ("flows.commands.growth", "what an update costs against a full build: a held-out share added back, every method"),
    "report": ("flows.commands.report", "results table and figures from the catalog → artifacts/reports/<name>/report.md"),
    "query": ("flows.commands.query", "ranked passages (and answers) for your own questions from a built index"),
    "serve": ("flows.commands.serve", "an HTTP service over a built index: micro-batched /retrieve, /answer, a search page"),
    "mcp": ("flows.commands.mcp", "an MCP server over a built index (stdio or streamable HTTP): retrieve/answer tools"),
    "loadtest": ("flows.commands.loadtest", "served throughput and latency at several concurrencies, batching on and off"),
    "schedule": ("flows.commands.schedule", "serve index/evaluate as Prefect deployments on cron schedules (conf/schedule.yaml)"),
    "plan": ("flows.commands.plan", "what a run with these overrides would reuse and compute, before it runs"),
    "doctor": ("flows.commands.doctor", "check every stored file against its hash; doctor.repair=true quarantines and repairs"),
}

# commands whose run needs Prefect's API: their temporary server is launched before their own start-up
# (scale, growth: one server that each child process inherits, instead of one started per child)
NEEDS_API = {"evaluate", "index", "update", "benchmark", "compare", "scale", "growth", "report"}
# commands that only read a built index (and `dagrag query` without a questions file): a read-only store serves
READ_ONLY = {"serve", "mcp", "loadtest"}
NO_RUN_FLAGS = {"-h", "--help", "--hydra-help", "-c", "--cfg", "-i", "--info", "--shell-completion", "-sc"}

USAGE = "usage: dagrag COMMAND [overrides] [hydra flags]\n\ncommands:\n" + "\n".join(
    f"  {name:<10} {what}" for name, (_, what) in COMMANDS.items()
) + "\n\n`dagrag COMMAND --help` lists the config groups and keys."


def main(argv: list[str] | None = None, default: str | None = None) -> int:
    """Run ``COMMAND`` with the remaining arguments as its command line; returns the exit status.

    ``default`` names the command used when the first argument is not one (``python -m flows`` passes
    ``evaluate``); without it such a call prints the usage and returns 2.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if args and args[0] in COMMANDS:
        command, rest = args[0], args[1:]
    elif args[:1] in (["-h"], ["--help"], ["help"]):
        print(USAGE)
        return 0
    elif default is not None:
        command, rest = default, args
    else:
        what = f"unknown command {args[0]!r}" if args else "no command given"
        print(f"dagrag: {what}\n\n{USAGE}", file=sys.stderr)
        return 2
    # SIGTERM (`kill`, a scheduler's stop) ends a command as Ctrl-C does: one `interrupted:` line. Within a flow run
    # Prefect marks the run crashed, then sends SIGTERM again to this handler (prefect.utilities.engine)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return _run(command, rest)
    except KeyboardInterrupt:  # Ctrl-C outside a flow run (imports, checks); inside one, run_command handles it
        from flows.runtime.exits import EXIT_INTERRUPTED, INTERRUPTED

        print(INTERRUPTED, file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    finally:
        # The command is done: exempt every object from the full collection that ends the interpreter
        # (1-2 s of gc_collect_main over torch's, Prefect's and pandas' objects, py-spy). The exit hooks
        # still run (the temporary server's stop, Prefect's log and event drains, open files' flush).
        gc.freeze()


def _run(command: str, rest: list[str]) -> int:
    """Check ``artifacts_dir``, then run the command's module as ``python -m`` would; its exit status."""
    module = COMMANDS[command][0]
    if (command in NEEDS_API or command == "query" and flow_run_query(rest)) and not NO_RUN_FLAGS.intersection(rest):
        from flows.runtime.api_server import launch_api

        launch_api()  # its start-up overlaps the command's imports and checks (flows.runtime.api_server)
    if not NO_RUN_FLAGS.intersection(rest):  # before Hydra (its advice for a mistyped key is `+key=…`, which
        # then fails on the check below; a blocked artifacts_dir fails its run folder with a traceback)
        from flows.runtime.config import ConfigError, check_top_level_keys, override_keys
        from flows.runtime.exits import EXIT_USER_ERROR
        from flows.runtime.preflight import PreflightError, artifacts_dir_of, check_artifacts_dir

        # dagrag query: the questions after `--` are no overrides; dagrag loadtest: its own loadtest.* keys
        overrides = [o for o in split_questions(rest)[0] if not (command == "loadtest" and o.startswith("loadtest."))]
        writes = command not in READ_ONLY and not (command == "query" and not flow_run_query(rest))
        try:
            if command != "schedule":  # conf/schedule.yaml is a config of its own
                check_top_level_keys(override_keys(overrides))
            where = artifacts_dir_of(overrides, Path(__file__).resolve().parents[1] / "conf") if writes else None
            if where is not None:
                check_artifacts_dir(where)
        except (ConfigError, PreflightError) as err:
            from flows.runtime.api_server import stop_api

            stop_api()
            print(f"error: {err}", file=sys.stderr, flush=True)
            return EXIT_USER_ERROR
    sys.argv = [module, *rest]  # runpy puts the module's file in argv[0], as `python -m` does
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:  # the command's own `sys.exit(...)`
        code = done.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
