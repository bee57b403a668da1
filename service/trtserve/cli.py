"""``trtserve`` command line: serve, build, and the tools around them.

The CLI only parses arguments into the library's objects; no environment variable is read
below this module. Every option of ``serve`` (and the global logging options) can also be set
as ``TRTSERVE_<FLAG>`` (``--grace-period`` → ``TRTSERVE_GRACE_PERIOD``; switches take 1/0,
true/false, yes/no, on/off); a flag on the command line wins. The bearer token is read from
``--auth-token-file`` or, without it, ``TRTSERVE_AUTH_TOKEN``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path
from types import ModuleType

from trtserve.client import AUTH_TOKEN_ENV, read_token_file
from trtserve.engine.lifecycle import DEFAULT_POLL_SECS, ControlMode, LifecycleConfig
from trtserve.frontend.grpc.server import Keepalive
from trtserve.frontend.grpc.service import DEFAULT_STREAM_INFLIGHT
from trtserve.frontend.http.protocol import HttpLimits
from trtserve.frontend.queue.door import QueueSettings
from trtserve.frontend.state import DEFAULT_MAX_MESSAGE_BYTES
from trtserve.runtimes.threads import DEFAULT_COMPUTE_NICE, MAX_NICE

log = logging.getLogger("trtserve")

ENV_PREFIX = "TRTSERVE_"
DEFAULT_HTTP_PORT = 8000
DEFAULT_METRICS_PORT = 8002
_KEEPALIVE = Keepalive()
KEEPALIVE_FLAGS = (
    # flag, default, meaning: one per Keepalive field, in its order
    ("--grpc-keepalive-time", _KEEPALIVE.time_ms, "how often the server pings an idle connection, ms"),
    ("--grpc-keepalive-timeout", _KEEPALIVE.timeout_ms, "how long a ping may go unanswered before the connection "
                                                          "closes, ms"),
    ("--grpc-keepalive-permit-without-calls", _KEEPALIVE.permit_without_calls,
     "accept and send pings on a connection with no call in progress"),
    ("--grpc-http2-max-pings-without-data", _KEEPALIVE.max_pings_without_data,
     "pings the server may send with no data in between (0: any number)"),
    ("--grpc-http2-min-recv-ping-interval-without-data", _KEEPALIVE.min_recv_ping_interval_without_data_ms,
     "the shortest interval between client pings accepted while no data flows, ms; a faster one is a strike "
     "(gRPC's own default is 300000, which ends calls of clients that ping every 10 s)"),
    ("--grpc-http2-max-ping-strikes", _KEEPALIVE.max_ping_strikes,
     "strikes before the server ends the connection with GOAWAY 'too many pings' (0: never)"),
)
_HTTP_LIMITS = HttpLimits()
HTTP_LIMIT_FLAGS = (
    # flag, HttpLimits field, type, meaning: what the HTTP door holds each client to
    ("--http-header-timeout", "header_timeout", float,
     "seconds from a request's first byte to the end of its headers; slower: 408 and the connection closed"),
    ("--http-body-timeout", "body_timeout", float,
     "seconds a request body may take before --http-body-min-rate applies; slower: 408 and the connection closed"),
    ("--http-body-min-rate", "body_min_rate", int,
     "bytes per second a body must average after --http-body-timeout (0: the whole body within it)"),
    ("--http-max-header-bytes", "max_header_bytes", int,
     "largest request line and headers in bytes; larger: 431 and the connection closed"),
    ("--http-max-headers", "max_headers", int, "most header lines in a request; more: 431 and the connection closed"),
    ("--http-keepalive-timeout", "keepalive_timeout", float,
     "seconds an HTTP connection may stay idle, before its first request or between requests, before it is closed"),
)
QUEUE_FLAGS = (
    # flag, default, meaning: the queue door's settings beside --redis-url (QueueSettings' fields)
    ("--redis-claim-idle", 30.0, "seconds an entry may stay pending with one consumer before another reclaims it"),
    ("--redis-max-deliveries", 5, "deliveries of an entry without an answer before it goes to the dead-letter stream"),
    ("--redis-result-ttl", 3600.0, "seconds a result key lives unless the message sets result_ttl_s"),
)
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


def _window(text: str) -> int | None:
    """``--http-window``: ``auto`` → None (learned), else a whole number >= 0."""
    if text == "auto":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be 'auto' or a whole number >= 0 (0: none), got {text!r}")
    return int(text)


def env_name(action: argparse.Action) -> str:
    """``--grace-period`` → ``TRTSERVE_GRACE_PERIOD``."""
    return ENV_PREFIX + action.option_strings[-1].lstrip("-").upper().replace("-", "_")


def _env_defaults(parser: argparse.ArgumentParser) -> None:
    """Default every option of ``parser`` to its ``TRTSERVE_<FLAG>`` environment variable
    (argparse converts a string default with the option's type) and name it in ``--help``."""
    for action in parser._actions:
        if not action.option_strings or action.default is argparse.SUPPRESS:
            continue
        name = env_name(action)
        action.help = f"{action.help or ''} [env {name}]".strip()
        if name not in os.environ:
            continue
        value = os.environ[name]
        if action.nargs == 0:  # a switch
            if value.strip().lower() not in _TRUE | _FALSE:
                parser.error(f"{name}={value!r}: expected one of 1/0, true/false, yes/no, on/off")
            action.default = action.const if value.strip().lower() in _TRUE else action.default
        elif isinstance(action, argparse._AppendAction):  # repeatable: comma-separated in the variable
            action.default = [v.strip() for v in value.split(",") if v.strip()]
        else:
            action.default = value


def _boolean(text: str) -> bool:
    """``true``/``false`` (and 1/0, yes/no, on/off) as a flag value."""
    value = text.strip().lower()
    if value not in _TRUE | _FALSE or not value:
        raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")
    return value in _TRUE


def _nice(text: str) -> int:
    """A nice value to add, 0..19."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_NICE:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to {MAX_NICE}, got '{text}'")
    return value


def _add_repository(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-repository", type=Path, default=Path("engines"),
                   help="model repository directory (default: engines)")


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; only the ``selected`` tool's module is imported for its flags.

    Every option's default is its ``TRTSERVE_<FLAG>`` environment variable where set; a
    malformed switch value exits with argparse's usage error (status 2)."""
    parser = argparse.ArgumentParser(
        prog="trtserve",
        description="trtserve: a gRPC inference server (KServe v2 / Triton protocol) "
                    "with a deadline-aware batching dispatcher.",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    parser.add_argument("--log-format", default="text", choices=["text", "json"],
                        help="log lines as text or as one JSON object each (default: text)")
    parser.add_argument("--log-requests", action="store_true",
                        help="log one line per request: request id, model, status, duration "
                             "(logger trtserve.requests)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the model repository over gRPC (KServe v2 / Triton protocol)")
    _add_repository(serve)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: 127.0.0.1; 0.0.0.0 for all)")
    serve.add_argument("--port", type=int, default=8001, help="gRPC port (default: 8001; 0 picks a free one)")
    serve.add_argument("--allow-http", type=_boolean, default=True, metavar="true|false",
                       help="also serve the KServe v2 REST API (HTTP/1.1, JSON and the binary tensor extension) and "
                            "OpenAI /v1/embeddings on --http-port, over the same models, gate and drain "
                            "(default: true, as Triton)")
    serve.add_argument("--http-port", type=int, default=None,
                       help=f"HTTP port (default: {DEFAULT_HTTP_PORT}; 0 picks a free one)")
    serve.add_argument("--frontends", default="auto",
                       help="gRPC front-end processes sharing the port (SO_REUSEPORT; each client connection "
                            "stays with one); 'auto': one per two cores, 1..8 (default: auto)")
    serve.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES,
                       help=f"largest request or response message in bytes (default: {DEFAULT_MAX_MESSAGE_BYTES})")
    serve.add_argument("--max-receive-bytes", type=int, default=0,
                       help="largest request message in bytes, when it should differ from --max-message-bytes "
                            "(default: 0, the same)")
    serve.add_argument("--stream-inflight", type=int, default=DEFAULT_STREAM_INFLIGHT,
                       help="requests of one stream processed at once before reading pauses "
                            f"(default: {DEFAULT_STREAM_INFLIGHT})")
    serve.add_argument("--max-inflight-rpcs", default="auto",
                       help="most inference requests in progress per front end (unary calls and stream messages; "
                            "health, metadata, statistics and model control never count); more are answered "
                            "RESOURCE_EXHAUSTED before their tensors are decoded. 'auto' (default): the models' "
                            "measured capacity x their longest default timeout, recomputed as models load and unload "
                            "(none where a model has neither default_timeout nor max_queue_size); 0: no bound")
    serve.add_argument("--grpc-max-concurrent-streams", type=int, default=0, metavar="N",
                       help="HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS of each gRPC connection: calls beyond N on one "
                            "connection wait in the client until one ends, costing the server nothing; size it as "
                            "the connection's share of the capacity x the deadline (Little's law; "
                            "docs/concepts/overload.md) (default: 0, no limit)")
    serve.add_argument("--cpu-workers", type=int, default=2,
                       help="threads per front end for handler pre/post-processing (default: 2)")
    serve.add_argument("--intra-op-threads", type=int, default=0,
                       help="ONNX Runtime threads per session (default: 0, one per core)")
    serve.add_argument("--compute-nice", type=_nice, default=DEFAULT_COMPUTE_NICE, metavar="N",
                       help="added to the nice value of ONNX Runtime's threads, so the event loops that read, refuse "
                            "and answer calls run first when both want a core (0..19; 0: the process's priority) "
                            f"(default: {DEFAULT_COMPUTE_NICE})")
    serve.add_argument("--grace-period", type=float, default=30.0,
                       help="seconds to finish queued work on SIGTERM or SIGINT (default: 30)")
    serve.add_argument("--max-request-elements", type=int, default=0,
                       help="most tensor elements one request may declare over its inputs, checked before any "
                            "allocation (default: 0, as many as --max-message-bytes)")
    serve.add_argument("--allow-metrics", type=_boolean, default=True, metavar="true|false",
                       help="serve Prometheus /metrics on --metrics-port (default: true, as Triton)")
    serve.add_argument("--metrics-port", type=int, default=None,
                       help=f"Prometheus /metrics HTTP port (default: {DEFAULT_METRICS_PORT}; 0 picks a free one)")
    serve.add_argument("--metrics-host", default="127.0.0.1",
                       help="address of the metrics endpoint (default: 127.0.0.1)")
    serve.add_argument("--tls-cert", type=Path,
                       help="server certificate chain (PEM); with --tls-key, serve TLS (and HTTPS with --allow-http)")
    serve.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    serve.add_argument("--tls-ca", type=Path,
                       help="CA certificates (PEM) for mutual TLS: clients must present a certificate signed by them")
    serve.add_argument("--auth-token-file", type=Path,
                       help="require 'authorization: Bearer <token>' with the token in this file "
                            f"(else ${AUTH_TOKEN_ENV}, if set)")
    serve.add_argument("--auth-health", action="store_true",
                       help="require the token for health checking and reflection too (default: they stay open)")
    queue = serve.add_argument_group("the queue door: requests through Redis Streams (docs/guide/queue.md)")
    queue.add_argument("--redis-url", default=None, metavar="URL",
                       help="read requests from Redis Streams at this URL (redis://HOST:PORT/DB; one stream per model, "
                            "trtserve:requests:<model>) and answer into result keys (default: no queue door)")
    for flag, default, meaning in QUEUE_FLAGS:
        queue.add_argument(flag, type=type(default), default=None, metavar="N",
                           help=f"with --redis-url: {meaning} (default: {default})")
    keepalive = serve.add_argument_group("gRPC keepalive and ping policy (Triton's flags; times in ms)")
    for flag, default, meaning in KEEPALIVE_FLAGS:
        kind = _boolean if isinstance(default, bool) else int
        keepalive.add_argument(flag, type=kind, default=default, metavar="true|false" if kind is _boolean else "N",
                               help=f"{meaning} (default: {str(default).lower()})")
    http_limits = serve.add_argument_group("HTTP door limits (every resource a client can hold is bounded)")
    for flag, name, kind, meaning in HTTP_LIMIT_FLAGS:
        default = getattr(_HTTP_LIMITS, name)
        http_limits.add_argument(flag, type=kind, default=default, metavar="N",
                                 help=f"{meaning} (default: {default:g})")
    http_limits.add_argument("--http-window", type=_window, default=0, metavar="auto|N",
                             help="inference requests the HTTP door runs at once; the rest wait unread and one "
                                  "still waiting at its trtserve-timeout-us deadline is answered 504 (auto: learned "
                                  "while serving from how close the requests let in come to their deadlines; N: "
                                  "fixed; 0: none) (default: 0)")
    serve.add_argument("--model-control-mode", choices=[m.value for m in ControlMode],
                       default=ControlMode.NONE.value,
                       help="none: every model loaded at start, no changes; poll: the repository is rescanned every "
                            "--repository-poll-secs; explicit: RepositoryModelLoad/Unload decide (default: none)")
    serve.add_argument("--load-model", action="append", default=[], metavar="NAME",
                       help="explicit mode: a model to load at start (repeatable; '*' for every model)")
    serve.add_argument("--repository-poll-secs", type=float, default=None, metavar="SECONDS",
                       help=f"poll mode: seconds between scans of the repository (default: {DEFAULT_POLL_SECS:g})")
    serve.add_argument("--strict-readiness", type=_boolean, default=True, metavar="true|false",
                       help="true: ServerReady and health wait for every model asked for; false: for the server to "
                            "be up and answering (default: true)")

    for name, (_module, help_text) in TOOLS.items():
        tool = sub.add_parser(name, help=help_text)
        _add_repository(tool)
        if name == selected:
            _tool(name).add_arguments(tool)
    _env_defaults(parser)
    _env_defaults(serve)
    return parser


# Subcommands: name → (module with add_arguments(parser) and run(args) -> int, help). The user
# tools are in trtserve/tools/; the developer harness (demo, bench, simulate) in trtserve/harness/,
# loaded by name only when chosen (nothing of the product imports it; it needs the `bench` extra).
TOOLS = {
    "build": ("trtserve.tools.build",
              "build every model of the repository (ONNX exports, test models, TensorRT plans)"),
    "demo": ("trtserve.harness.demo",
             "the main job on real data: STS-B dev through a live server, then a corpus embed"),
    "check": ("trtserve.tools.check",
              "check that a model (and its handler) gives the same answers batched as alone"),
    "bench": ("trtserve.harness.bench",
              "served throughput and latency against the raw engine, in one run, with plots"),
    "simulate": ("trtserve.harness.simulate",
                 "compare dispatch policies (fixed timers vs adaptive) on the same simulated arrival trace"),
    "profile": ("trtserve.tools.profile",
                "measure a model's throughput and latency against batch size and recommend max_batch_size"),
    "policy": ("trtserve.tools.policy", "read or change a running model's batching policy (ModelControl RPC)"),
    "bulk": ("trtserve.tools.bulk",
             "run a model over a whole file (JSONL/CSV/Parquet) through servers or Ray into Parquet, resumably"),
}


def _tool(name: str) -> ModuleType:
    """The module of subcommand ``name``.

    Raises:
        SystemExit: a harness command whose ``bench`` extra is not installed (status 2, one line).
    """
    module = TOOLS[name][0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if not module.startswith("trtserve.harness.") or (exc.name or "").startswith("trtserve"):
            raise
        print(f"trtserve {name}: needs the bench extra (pip install 'trtserve[bench]'): {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``trtserve`` command; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    selected = next((a for a in argv if a in TOOLS), None)
    args = build_parser(selected).parse_args(argv)
    from trtserve import logs

    logs.configure(args.log_level, args.log_format, args.log_requests)
    if args.command in TOOLS:
        return _tool(args.command).run(args)
    return cmd_serve(args)


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, then drain (a second signal exits at once): the process
    tree of :mod:`trtserve.serving.supervisor`."""
    from trtserve.repository import ConfigError, check_repository
    from trtserve.serving.settings import ServeConfig, default_frontends
    from trtserve.serving.supervisor import serve

    try:
        check_repository(args.model_repository)
    except ConfigError as exc:
        print(f"trtserve serve: {exc}", file=sys.stderr)
        return 2
    for flag, value, door in (("--http-port", args.http_port, "--allow-http"),
                              ("--metrics-port", args.metrics_port, "--allow-metrics")):
        if value is not None and not getattr(args, door.lstrip("-").replace("-", "_")):
            print(f"trtserve serve: {flag} {value} needs {door} true ({door} false turns that door off)",
                  file=sys.stderr)
            return 2
    http_port = DEFAULT_HTTP_PORT if args.http_port is None else args.http_port
    metrics_port = DEFAULT_METRICS_PORT if args.metrics_port is None else args.metrics_port
    for flag, value in (("--port", args.port), ("--http-port", http_port), ("--metrics-port", metrics_port)):
        if not 0 <= value <= 65535:
            print(f"trtserve serve: {flag} must be in 0..65535 (0: a free one), got {value}", file=sys.stderr)
            return 2
    try:
        frontends = default_frontends() if args.frontends == "auto" else int(args.frontends)
        if frontends < 1:
            raise ValueError
    except ValueError:
        print(f"trtserve serve: --frontends must be 'auto' or a whole number >= 1, got '{args.frontends}'",
              file=sys.stderr)
        return 2
    try:
        inflight: int | str = "auto" if args.max_inflight_rpcs == "auto" else int(args.max_inflight_rpcs)
        if inflight != "auto" and int(inflight) < 0:
            raise ValueError
    except ValueError:
        print(f"trtserve serve: --max-inflight-rpcs must be 'auto' or a whole number >= 0 (0: no bound), "
              f"got '{args.max_inflight_rpcs}'", file=sys.stderr)
        return 2
    if args.grpc_max_concurrent_streams < 0:
        print(f"trtserve serve: --grpc-max-concurrent-streams must be a whole number >= 0 (0: no limit), "
              f"got {args.grpc_max_concurrent_streams}", file=sys.stderr)
        return 2
    if frontends > (os.cpu_count() or 1):
        log.warning("--frontends %d is more than this machine's %d cores: the front ends will compete for them",
                    frontends, os.cpu_count() or 1)
    try:
        security = _security(args)
        lifecycle = _lifecycle(args)
        keepalive = _keepalive(args)
        http_limits = HttpLimits(**{name: getattr(args, flag.lstrip("-").replace("-", "_"))
                                    for flag, name, _, _ in HTTP_LIMIT_FLAGS}, window=args.http_window)
        queue = _queue(args)
    except ValueError as exc:
        print(f"trtserve serve: {exc}", file=sys.stderr)
        return 2
    config = ServeConfig(
        repository=args.model_repository,
        host=args.host,
        port=args.port,
        http_port=http_port if args.allow_http else None,
        http_limits=http_limits,
        frontends=frontends,
        grace=args.grace_period,
        frontend=dict(
            max_message_bytes=args.max_message_bytes,
            max_receive_bytes=args.max_receive_bytes or None,
            stream_inflight=args.stream_inflight,
            max_request_elements=args.max_request_elements or None,
            max_inflight_rpcs=inflight,
            max_concurrent_streams=args.grpc_max_concurrent_streams or None,
            keepalive=keepalive,
            queue=queue,
            **security,
        ),
        cpu_workers=args.cpu_workers,
        intra_op_threads=args.intra_op_threads,
        compute_nice=args.compute_nice,
        metrics_host=args.metrics_host,
        metrics_port=metrics_port if args.allow_metrics else None,
        log_level=args.log_level,
        log_format=args.log_format,
        log_requests=args.log_requests,
        lifecycle=lifecycle,
    )
    return serve(config)


def _keepalive(args: argparse.Namespace) -> Keepalive:
    """The keepalive policy from the ``--grpc-keepalive-*`` and ``--grpc-http2-*`` flags.

    Raises:
        ValueError: a time that is not > 0 or a count < 0 (the message names it).
    """
    return Keepalive(*(getattr(args, flag.lstrip("-").replace("-", "_")) for flag, _, _ in KEEPALIVE_FLAGS))


def _queue(args: argparse.Namespace) -> QueueSettings | None:
    """The queue door's settings from ``--redis-url`` and the ``--redis-*`` flags (None: no door).

    Raises:
        ValueError: a ``--redis-*`` flag without ``--redis-url``, or a value out of range.
    """
    given = {flag: getattr(args, flag.lstrip("-").replace("-", "_")) for flag, _, _ in QUEUE_FLAGS}
    if not args.redis_url:
        stray = [flag for flag, value in given.items() if value is not None]
        if stray:
            raise ValueError(f"{', '.join(stray)} need --redis-url (the queue door is off)")
        return None
    values = {flag.removeprefix("--redis-").replace("-", "_"): value for flag, value in given.items()
              if value is not None}
    return QueueSettings(args.redis_url, claim_idle=values.get("claim_idle", 30.0),
                         max_deliveries=values.get("max_deliveries", 5), result_ttl=values.get("result_ttl", 3600.0))


def _lifecycle(args: argparse.Namespace) -> LifecycleConfig:
    """The model control settings from the flags.

    Raises:
        ValueError: ``--load-model`` outside explicit mode or naming no model of the
            repository, ``--repository-poll-secs`` outside poll mode or not > 0.
    """
    from trtserve.repository import model_dirs

    mode = ControlMode(args.model_control_mode)
    if args.repository_poll_secs is not None and mode is not ControlMode.POLL:
        raise ValueError(f"--repository-poll-secs needs --model-control-mode poll (the mode is {mode.value})")
    found = model_dirs(args.model_repository)
    unknown = [name for name in args.load_model if name != "*" and name not in found]
    if unknown:
        raise ValueError(f"--load-model {', '.join(unknown)}: no such model in {args.model_repository} "
                         f"(it has {', '.join(found)})")
    return LifecycleConfig(
        mode=mode,
        load_models=tuple(args.load_model),
        poll_secs=DEFAULT_POLL_SECS if args.repository_poll_secs is None else args.repository_poll_secs,
        strict_readiness=args.strict_readiness,
    )


def _security(args: argparse.Namespace) -> dict[str, object]:
    """TLS and auth keyword arguments of :func:`~trtserve.frontend.grpc.server.start_frontend`
    from the flags and the environment.

    Raises:
        ValueError: an incomplete TLS pair, a CA without TLS, or an unreadable or empty file.
    """
    from trtserve.frontend.grpc.security import TlsConfig

    out: dict[str, object] = {}
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ValueError("--tls-cert and --tls-key go together")
    if args.tls_ca and not args.tls_cert:
        raise ValueError("--tls-ca (mutual TLS) needs --tls-cert and --tls-key")
    if args.tls_cert:
        out["tls"] = TlsConfig.from_files(args.tls_cert, args.tls_key, args.tls_ca)
    token = os.environ.get(AUTH_TOKEN_ENV, "").strip() or None
    if args.auth_token_file:
        try:
            token = read_token_file(args.auth_token_file)
        except OSError as exc:
            raise ValueError(f"cannot read --auth-token-file {args.auth_token_file}: {exc.strerror or exc}") from exc
        except ValueError:
            raise ValueError(f"--auth-token-file {args.auth_token_file} is empty") from None
    if token:
        out["auth_token"] = token
        out["auth_health"] = args.auth_health
    elif args.auth_health:
        raise ValueError("--auth-health needs a token (--auth-token-file or $" + AUTH_TOKEN_ENV + ")")
    return out


if __name__ == "__main__":
    sys.exit(main())
