"""`rollout` entry point: parses the subcommand and maps errors to exit codes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from rollout import __version__
from rollout.cli import audit, cache, export, generate, jobs, run, score, serve, sweep
from rollout.errors import ConfigError, EngineError, InputError, RolloutError

SUBCOMMANDS = (generate, run, score, sweep, serve, jobs, audit, cache, export)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollout", description="Deterministic, reproducible LLM rollouts."
    )
    parser.add_argument("--version", action="version", version=f"rollout {__version__}")
    parser.add_argument("--log-level", default=None, metavar="LEVEL",
                        help="debug, info (default), warning or error (env ROLLOUT_LOG_LEVEL)")  # fmt: skip
    parser.add_argument("--log-format", default=None, choices=["text", "json"],
                        help="text lines (default) or one JSON object per line, e.g. for the service (env ROLLOUT_LOG_FORMAT)")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Nothing is ever fetched from a hub at run time.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    try:
        from rollout import logs

        logs.setup(args.log_level, args.log_format)
        return int(args.run(args) or 0)
    except (ConfigError, InputError) as exc:
        print(f"rollout: error: {exc}", file=sys.stderr)
        return 2
    except (EngineError, RolloutError) as exc:
        print(f"rollout: engine error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        import grpc

        if isinstance(exc, grpc.RpcError):
            code = exc.code()
            print(f"rollout: error: {code.name}: {exc.details()}", file=sys.stderr)
            user = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED)  # fmt: skip
            return 2 if code in user else 1
        raise
    except KeyboardInterrupt:
        print("rollout: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
