"""``trtserve`` command line: serve, build, and the tools around them.

The CLI only parses arguments into the library's objects; no environment variable is read
below this module.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import logging
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from .server import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_STREAM_INFLIGHT

log = logging.getLogger("trtserve")


def _add_repository(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-repository", type=Path, default=Path("engines"), help="model repository directory (default: engines)")


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; only the ``selected`` tool's module is imported for its flags."""
    parser = argparse.ArgumentParser(prog="trtserve", description="trtserve: a gRPC inference server (KServe v2 / Triton protocol) with a deadline-aware batching dispatcher.")
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the model repository over gRPC (KServe v2 / Triton protocol)")
    _add_repository(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1; 0.0.0.0 for all)")
    serve.add_argument("--port", type=int, default=8001, help="gRPC port (default: 8001; 0 picks a free one)")
    serve.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES,
                       help=f"largest request or response message in bytes (default: {DEFAULT_MAX_MESSAGE_BYTES})")
    serve.add_argument("--stream-inflight", type=int, default=DEFAULT_STREAM_INFLIGHT,
                       help=f"requests of one stream processed at once before reading pauses (default: {DEFAULT_STREAM_INFLIGHT})")
    serve.add_argument("--cpu-workers", type=int, default=2, help="threads for handler pre/post-processing (default: 2)")
    serve.add_argument("--intra-op-threads", type=int, default=0, help="ONNX Runtime threads per session (default: 0, one per core)")
    serve.add_argument("--grace-period", type=float, default=30.0, help="seconds to finish queued work on SIGTERM (default: 30)")

    build = sub.add_parser("build", help="build every model of the repository (ONNX exports, test models, TensorRT plans)")
    _add_repository(build)
    build.add_argument("--force", action="store_true", help="rebuild even when inputs are unchanged")
    build.add_argument("models", nargs="*", help="only these models (default: all with a build.py)")

    for name, help_text in TOOLS.items():
        tool = sub.add_parser(name, help=help_text)
        _add_repository(tool)
        if name == selected:
            importlib.import_module(f"trtserve.tools.{name}").add_arguments(tool)
    return parser


# Subcommands implemented in trtserve/tools/<name>.py: add_arguments(parser) and run(args) -> int.
TOOLS = {
    "demo": "the main job on real data: STS-B dev through a live server, then a corpus embed",
    "check": "check that a model (and its handler) gives the same answers batched as alone",
    "bench": "served throughput and latency against the raw engine, in one run, with plots",
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``trtserve`` command; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    selected = next((a for a in argv if a in TOOLS), None)
    args = build_parser(selected).parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command in TOOLS:
        return importlib.import_module(f"trtserve.tools.{args.command}").run(args)
    return {"serve": cmd_serve, "build": cmd_build}[args.command](args)


def cmd_build(args: argparse.Namespace) -> int:
    """Run ``build(model_dir, force)`` of every ``engines/<model>/build.py``."""
    root: Path = args.model_repository
    recipes = sorted(root.glob("*/build.py"))
    if args.models:
        recipes = [r for r in recipes if r.parent.name in args.models]
    for recipe in recipes:
        model_dir = recipe.parent
        spec = importlib.util.spec_from_file_location(f"trtserve_build_{model_dir.name}", recipe)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        changed = module.build(model_dir, force=args.force)
        print(f"{model_dir.name}: {'built' if changed else 'up to date'}")
    print(
        "TensorRT plans need an NVIDIA GPU with TensorRT; none was found, so the ONNX models will be served by ONNX Runtime on the CPU."
    )
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, then drain (a second signal exits at once)."""
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    from . import runtimes
    from .clock import MonotonicClock
    from .repository import Repository
    from .server import drain, start_server

    options = runtimes.RuntimeOptions(intra_op_threads=args.intra_op_threads)
    pool = ThreadPoolExecutor(args.cpu_workers, thread_name_prefix="cpu")
    repository = Repository(
        args.model_repository,
        clock=MonotonicClock(),
        pool=pool,
        backend_factory=partial(runtimes.create, options=options),
    )
    await repository.load_all()
    server, service, port = await start_server(
        repository,
        host=args.host,
        port=args.port,
        max_message_bytes=args.max_message_bytes,
        stream_inflight=args.stream_inflight,
    )
    for name, entry in sorted(repository.models.items()):
        log.info("model %-16s %s %s", name, entry.state.value, entry.reason)
    # Tests and tools read the bound port from this line.
    print(f"trtserve listening on {args.host}:{port}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            log.warning("second signal: exiting now")
            sys.exit(1)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await stop.wait()
    log.info("draining (grace period %.1f s)", args.grace_period)
    await drain(server, service, repository, args.grace_period)
    pool.shutdown(wait=False)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
