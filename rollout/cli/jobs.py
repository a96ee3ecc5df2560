"""Client commands: `rollout submit | status | watch | list | cancel | manifest`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml


def add_client_options(p: argparse.ArgumentParser, server_help: str | None = None) -> None:
    """--server, --token-file, --tls-ca and --json: how a command reaches the service."""
    p.add_argument(
        "--server",
        help=server_help or "service address (env ROLLOUT_SERVER; default 127.0.0.1:50051)",
    )
    p.add_argument("--token-file", help="bearer token file (env ROLLOUT_TOKEN_FILE)")
    p.add_argument("--tls-ca", help="PEM root certificate for a TLS server")
    p.add_argument("--json", action="store_true", help="print JSON")


def add_parser(sub: Any) -> None:
    common = add_client_options
    p = sub.add_parser("submit", help="submit a job to the service")
    p.add_argument("config")
    p.add_argument("--output", help="output directory (config: output)")
    p.add_argument("--request-id", help="makes the submission idempotent")
    p.add_argument(
        "--wait", action="store_true", help="show progress; exit non-zero unless the job SUCCEEDED"
    )
    common(p)
    p.set_defaults(run=submit)
    for name, fn, text in (
        ("status", status, "show a job"),
        ("watch", watch, "follow a job until it ends"),
        ("cancel", cancel, "cancel a job"),
        ("manifest", manifest, "print a job's run manifest"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("job_id")
        common(p)
        p.set_defaults(run=fn)
    p = sub.add_parser("list", help="list jobs")
    p.add_argument(
        "--state", action="append", default=[], help="only jobs in this state (repeatable)"
    )
    common(p)
    p.set_defaults(run=list_jobs)


def client_from_args(args: argparse.Namespace):
    from rollout.client import RolloutClient

    token = Path(args.token_file).read_text().strip() if args.token_file else None
    ca = Path(args.tls_ca).read_bytes() if args.tls_ca else None
    return RolloutClient(args.server, token=token, root_cert=ca)


def _as_dict(job: Any) -> dict:
    from google.protobuf import json_format

    return json_format.MessageToDict(job, preserving_proto_field_name=True)


def _line(job: Any) -> str:
    from rollout.client import state_name

    p = job.progress
    text = f"{job.job_id}  {state_name(job):9s}  shards {p.shards_done}/{p.shards_total}  rows {p.rows}  {p.output_tokens_per_s:.0f} tok/s"
    if job.run_digest:
        text += f"  run_digest {job.run_digest}"
    if job.error:
        text += f"\n  error: {job.error}"
    return text


def submit(args: argparse.Namespace) -> int:
    try:
        spec = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        from rollout.errors import ConfigError

        raise ConfigError("config", args.config, f"cannot be read: {exc}") from None
    if args.output:
        spec["output"] = args.output
    # Relative local paths mean the submitter's current folder, not the server's.
    for key in ("input", None):
        holder, field = (spec.get("input") or {}, "path") if key else (spec, "output")
        value = holder.get(field)
        if isinstance(value, str) and "://" not in value and not Path(value).is_absolute():
            holder[field] = str(Path.cwd() / value)
    with client_from_args(args) as client:
        job = client.submit(spec, args.request_id)
        print(job.job_id if not args.json else json.dumps(_as_dict(job)))
        if args.wait:
            return _follow(client, job.job_id, quiet=args.json)
    return 0


def _follow(client: Any, job_id: str, quiet: bool) -> int:
    """Follow a job until it ends: a progress bar like `rollout run`'s (shards, rows,
    tokens per second, ETA) on a terminal, a line per change otherwise."""
    from tqdm import tqdm

    from rollout.client import state_name

    last = None
    terminal = not quiet and sys.stderr.isatty()
    bar = None
    try:
        for job in client.watch(job_id):
            p = job.progress
            if terminal:
                if bar is None or bar.total != p.shards_total:
                    if bar is not None:
                        bar.close()
                    bar = tqdm(total=p.shards_total, initial=p.shards_done, unit="shard", desc=job_id, file=sys.stderr, dynamic_ncols=True)  # fmt: skip
                bar.update(p.shards_done - bar.n)
                bar.set_postfix_str(f"{state_name(job)}, rows {p.rows}, {p.output_tokens_per_s:.0f} out tok/s" + (f", {p.rows_cached} cached" if p.rows_cached else ""), refresh=True)  # fmt: skip
            elif not quiet:
                print(_line(job), file=sys.stderr, flush=True)
            last = job
    finally:
        if bar is not None:
            bar.close()
    if last is not None and terminal:
        print(_line(last), file=sys.stderr, flush=True)
    return 0 if last is not None and state_name(last) == "SUCCEEDED" else 1


def _show(job: Any, as_json: bool) -> int:
    print(json.dumps(_as_dict(job)) if as_json else _line(job))
    return 0


def status(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        return _show(client.get(args.job_id), args.json)


def watch(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        return _follow(client, args.job_id, quiet=False)


def cancel(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        return _show(client.cancel(args.job_id), args.json)


def manifest(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        print(json.dumps(client.manifest(args.job_id), indent=1))
    return 0


def list_jobs(args: argparse.Namespace) -> int:
    with client_from_args(args) as client:
        for job in client.list([s.upper() for s in args.state]):
            _show(job, args.json)
    return 0
