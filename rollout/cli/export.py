"""`rollout export RUN --format openai-batch --output F`: a finished run in another tool's
format (docs/interop.md)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a finished run in another format (OpenAI Batch output)", description=__doc__)  # fmt: skip
    p.add_argument("run_dir", metavar="RUN", help="a finished run directory")
    p.add_argument("--format", required=True, choices=["openai-batch"], help="openai-batch: the Batch API's output and error files")  # fmt: skip
    p.add_argument("--output", required=True, help="the output file (JSONL)")
    p.add_argument("--errors", help="the error file; default: OUTPUT with _errors before its extension")  # fmt: skip
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from rollout.data.export_openai import export_openai_batch

    done, failed = export_openai_batch(args.run_dir, args.output, args.errors)
    print(f"wrote {done} responses to {args.output} and {failed} errors")
    return 0
