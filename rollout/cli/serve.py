"""`rollout serve`: the long-running gRPC service that owns the Ray driver."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from rollout.errors import ConfigError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the gRPC job service", description=__doc__)
    p.add_argument(
        "--address", default="127.0.0.1:50051", help="listen address (default: loopback only)"
    )
    p.add_argument(
        "--state-dir",
        default=os.path.expanduser("~/.local/state/rollout"),
        help="where the job store lives",
    )
    p.add_argument(
        "--data-root",
        action="append",
        default=[],
        help="a folder jobs may read and write (repeatable; default: the current folder)",
    )
    p.add_argument("--ray-address", help="join this Ray cluster; default: start one")
    p.add_argument("--max-concurrent-jobs", type=int, default=1)
    p.add_argument(
        "--token-file", help="require 'authorization: Bearer <token>' with the token in this file"
    )
    p.add_argument("--tls-cert", help="serve TLS with this PEM certificate (needs --tls-key)")
    p.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    p.add_argument("--metrics-address", metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (e.g. 127.0.0.1:9464)")  # fmt: skip
    p.add_argument("--allow-scorer", action="append", default=[], metavar="MODULE",
                   help="let jobs use the user scorers (module:function) of MODULE and its "
                        "submodules; repeatable. Without it, only built-in scorers run")  # fmt: skip
    p.add_argument("--max-streams", type=int, default=32,
                   help="open WatchJob/AuditRuns/VerifyRun streams at most (more: RESOURCE_EXHAUSTED)")  # fmt: skip
    p.add_argument("--max-streams-per-client", type=int, default=16,
                   help="open streams at most from one client host")  # fmt: skip
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rollout.api.server import Server

    if not 1 <= args.max_streams <= 10_000:
        raise ConfigError("--max-streams", args.max_streams, "must be in [1, 10000]")
    if not 1 <= args.max_streams_per_client <= args.max_streams:
        raise ConfigError("--max-streams-per-client", args.max_streams_per_client,
                          f"must be in [1, --max-streams = {args.max_streams}]")  # fmt: skip
    if args.max_concurrent_jobs < 1:
        raise ConfigError(
            "--max-concurrent-jobs",
            args.max_concurrent_jobs,
            f"must be >= 1, got {args.max_concurrent_jobs}",
        )
    if bool(args.tls_cert) != bool(args.tls_key):
        raise ConfigError("--tls-cert/--tls-key", None, "TLS needs both a certificate and its key")
    token = _read("--token-file", args.token_file).decode().strip() if args.token_file else None
    if args.token_file and not token:
        raise ConfigError("--token-file", args.token_file, "is empty")
    tls = (
        (_read("--tls-cert", args.tls_cert), _read("--tls-key", args.tls_key))
        if args.tls_cert
        else None
    )
    roots = [Path(r) for r in args.data_root] or [Path.cwd()]
    for r in roots:
        if not r.is_dir():
            raise ConfigError("--data-root", str(r), "is not a directory")
    server = Server(
        args.address,
        Path(args.state_dir),
        roots,
        args.max_concurrent_jobs,
        args.ray_address,
        token,
        tls,
        args.max_streams,
        args.max_streams_per_client,
        tuple(args.allow_scorer),
        args.metrics_address,
    )
    orphans = server.manager.orphaned_runs()
    if orphans:
        print(f"rollout serve: warning: the job store {server.store.path} is empty, but run folders "
              f"exist under the data roots ({', '.join(map(str, orphans))}, ...): if the store was "
              "lost, submit their specs again (job.json in each) and they resume",
              file=sys.stderr, flush=True)  # fmt: skip
    resumed = server.start()
    print(
        f"rollout serve: listening on {args.address} ({'TLS' if tls else 'plaintext'}"
        f"{', token auth' if token else ''}); data roots: {', '.join(map(str, roots))}; "
        f"state: {args.state_dir}"
        + (f"; resuming {len(resumed)} job(s)" if resumed else "")
        + (
            f"; metrics on http://{args.metrics_address.rpartition(':')[0]}:{server.metrics_port}/metrics"
            if args.metrics_address
            else ""
        ),
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print(
        "rollout serve: stopping; running jobs resume at the next start",
        file=sys.stderr,
        flush=True,
    )
    server.stop()
    return 0


def _read(flag: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(flag, path, f"cannot be read: {exc.strerror}") from None
