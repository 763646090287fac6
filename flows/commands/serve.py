"""``dagrag serve [overrides]``: an HTTP service over a built index (:mod:`flows.serving.app`).

The overrides are the ones that built the index, plus ``serve.*`` (``conf/serve/default.yaml``): address,
micro-batching (``serve.max_batch``, ``serve.max_wait_ms``), the queue bound, request limits, ``serve.watch``
and ``serve.drain_s``. It binds 127.0.0.1 unless ``serve.host`` says otherwise, and then only with
``DAGRAG_API_KEY`` set in the environment. Ctrl-C or SIGTERM stops taking requests, finishes those in flight
(at most ``serve.drain_s``) and exits 0. Nothing is written; no Prefect server is started.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import sys
from typing import Any

from flows.runtime.config import Config, load_config

log = logging.getLogger("dagrag.serve")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key_for(conf: Config) -> str | None:
    """``DAGRAG_API_KEY`` (None when unset or empty); an address beyond this machine refuses to start without it."""
    from flows.runtime.preflight import PreflightError
    from flows.serving.app import API_KEY_ENV

    key = os.environ.get(API_KEY_ENV) or None
    if key is None and not is_loopback(conf.serve.host):
        raise PreflightError(f"serve.host={conf.serve.host} would expose the index beyond this machine without "
                             f"authentication: set {API_KEY_ENV} in the environment (clients send "
                             f"Authorization: Bearer <key>), or keep the default serve.host=127.0.0.1")
    return key


def build_service(overrides: list[str], cfg: dict[str, Any], key: str | None) -> Any:
    """Open the index and wrap it in a :class:`flows.serving.app.Service` that can reopen it."""
    from flows.serving.app import Service
    from flows.serving.index import index_fingerprint, open_index, resolve

    from flows.runtime.dag import plan_run

    conf = load_config(cfg)
    print(f"serving: {plan_run(conf).summary()}", file=sys.stderr, flush=True)  # what dagrag plan says it opens
    index = open_index(*overrides, config=cfg)

    def reopen():
        return open_index(*overrides, config=cfg)

    def resolve_fp() -> str:
        return index_fingerprint(*resolve(conf, overrides))

    return Service(index, conf.serve, key, reopen=reopen, resolve_fp=resolve_fp)


def serve(service: Any, host: str, port: int, drain_s: float) -> None:
    """Run uvicorn until Ctrl-C or SIGTERM; prints the address once it listens."""
    import uvicorn

    from flows.serving.app import create_app

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                print("stopping: no new requests; finishing those in flight", file=sys.stderr, flush=True)
            super().handle_exit(sig, frame)
            self._captured_signals.clear()  # a stop asked for: exit 0 after the drain, not the signal's own death

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:
                bound = self.servers[0].sockets[0].getsockname() if self.servers else (host, port)
                info = service.index.info
                print(f"serving {info.method} on {info.dataset} (index {info.fingerprint}, built {info.built_at}) "
                      f"at http://{bound[0]}:{bound[1]}  (search page /, API docs /docs; Ctrl-C stops)", flush=True)

    config = uvicorn.Config(create_app(service), host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=drain_s, lifespan="on")
    Server(config).run()


def print_config(args: list[str]) -> int:
    """``--cfg job``: print the config these overrides compose (Hydra's flag, for the commands without Hydra's
    job folder); exit status 2 on a bad override."""
    from omegaconf import OmegaConf

    from flows.runtime.exits import USER_ERRORS, fail
    from flows.serving.index import compose

    at = args.index("--cfg")
    overrides = args[:at] + args[at + 2:]
    try:
        cfg = compose(overrides)
        load_config(cfg)
    except USER_ERRORS as err:
        fail(err)
    print(OmegaConf.to_yaml(cfg))
    return 0


def main(argv: list[str] | None = None) -> int:
    from flows.runtime.exits import USER_ERRORS, fail, verbose
    from flows.serving.checks import preflight_serving
    from flows.serving.index import compose

    overrides = sys.argv[1:] if argv is None else list(argv)
    if {"-h", "--help"} & set(overrides):
        print(__doc__)
        return 0
    if "--cfg" in overrides:  # as Hydra's flag: the composed config, nothing run
        return print_config(overrides)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # the service's own lines (a hot swap with both fingerprints, a failed watch) on stderr: basicConfig does
    # nothing where an import (Prefect's) has configured the root logger already, which left them unprinted
    service_log = logging.getLogger("dagrag.serve")
    if not service_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        service_log.addHandler(handler)
    service_log.setLevel(logging.INFO)
    service_log.propagate = False
    for noisy in ("httpx", "httpcore", "httpx2", "faiss.loader", "sentence_transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    cfg: dict[str, Any] = {}
    try:
        cfg = compose(overrides)
        conf = load_config(cfg)
        key = api_key_for(conf)
        preflight_serving(conf, "serve")
        service = build_service(overrides, cfg, key)
    except USER_ERRORS as err:
        fail(err, verbose(cfg))
    serve(service, conf.serve.host, conf.serve.port, conf.serve.drain_s)
    print("stopped: requests in flight were answered", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
