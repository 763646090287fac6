"""``dagrag mcp [overrides]``: an MCP server over a built index (:mod:`flows.integrations.mcp_server`).

The overrides are the ones that built the index, plus ``serve.*``: ``serve.mcp_transport=stdio`` (the default: an
agent host starts this command and speaks MCP over its stdin/stdout) or ``http`` (streamable HTTP at
``serve.host``:``serve.port`` + ``serve.mcp_path``, loopback unless ``DAGRAG_API_KEY`` is set, as ``dagrag serve``).
Tools: ``retrieve`` (question, k → passages with citations), ``answer`` when an LLM is configured; resource
``dagrag://index``. Needs the extra: ``pip install -e '.[mcp]'``. Nothing is written.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any


def main(argv: list[str] | None = None) -> int:
    from flows.commands.serve import api_key_for, print_config
    from flows.runtime.config import load_config
    from flows.runtime.exits import USER_ERRORS, fail, verbose
    from flows.serving.checks import preflight_serving
    from flows.serving.index import compose, open_index

    overrides = sys.argv[1:] if argv is None else list(argv)
    if {"-h", "--help"} & set(overrides):
        print(__doc__)
        return 0
    if "--cfg" in overrides:
        return print_config(overrides)
    # stdout is the protocol's channel over stdio: every log line goes to stderr
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg: dict[str, Any] = {}
    try:
        from flows.integrations.mcp_server import build_server, http_app
    except ImportError as err:
        fail(ImportError(f"dagrag mcp needs the MCP SDK ({err.name} is missing): pip install -e '.[mcp]'"))
    try:
        cfg = compose(overrides)
        conf = load_config(cfg)
        http = conf.serve.mcp_transport == "http"
        key = api_key_for(conf) if http else None  # stdio reaches no network: the host process owns the pipe
        preflight_serving(conf, "serve")
        with contextlib.redirect_stdout(sys.stderr):  # nothing but the protocol on stdout
            index = open_index(*overrides, config=cfg)
    except USER_ERRORS as err:
        fail(err, verbose(cfg))
    server = build_server(index, conf.serve.max_k, conf.serve.max_question_chars)
    if not http:
        server.run("stdio")
        return 0
    import uvicorn

    app = http_app(server, conf.serve.host, conf.serve.mcp_path, key)

    class Server(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:
                bound = self.servers[0].sockets[0].getsockname() if self.servers else (conf.serve.host, conf.serve.port)
                info = index.info
                print(f"serving MCP for {info.method} on {info.dataset} (index {info.fingerprint}) at "
                      f"http://{bound[0]}:{bound[1]}{conf.serve.mcp_path}  (Ctrl-C stops)", flush=True)

    Server(uvicorn.Config(app, host=conf.serve.host, port=conf.serve.port, log_level="warning",
                          access_log=False, timeout_graceful_shutdown=conf.serve.drain_s)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
