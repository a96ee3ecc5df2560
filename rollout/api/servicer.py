"""The RolloutService servicer: a thin adapter from gRPC to rollout.service.JobManager."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2

from rollout.api.proto import modules
from rollout.api.streams import StreamBudget
from rollout.errors import (
    AccessError,
    ClusterLost,
    ConfigError,
    Conflict,
    InputError,
    RolloutError,
    shorten,
)
from rollout.runtime.manifest import Manifest
from rollout.service.manager import JobManager, NotFound
from rollout.service.store import FINAL, STATES, JobRecord

pb, pb_grpc = modules()

MAX_PAGE = 500


def status_of(exc: BaseException) -> grpc.StatusCode:
    """The one mapping from rollout errors to gRPC status codes."""
    if isinstance(exc, (ConfigError, InputError)):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, AccessError):
        return grpc.StatusCode.PERMISSION_DENIED
    if isinstance(exc, Conflict):
        return grpc.StatusCode.ALREADY_EXISTS
    if isinstance(exc, NotFound):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, ClusterLost):
        return grpc.StatusCode.UNAVAILABLE
    if isinstance(exc, RolloutError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return grpc.StatusCode.INTERNAL


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def report_to_proto(report: Any) -> Any:
    """An AuditReport (rollout.audit.report) as its gRPC message: the same field names."""
    return json_format.ParseDict(_without_none(report.to_dict()), pb.AuditReport())


def to_proto(r: JobRecord) -> Any:
    spec = dict(r.spec)
    if isinstance(spec.get("job_seed"), int):  # exactly, as a string (a Struct number is a double)
        spec["job_seed"] = str(spec["job_seed"])
    return pb.Job(
        job_id=r.job_id,
        state=pb.JobState.Value(r.state),
        spec=json_format.ParseDict(spec, struct_pb2.Struct()),
        request_id=r.request_id or "",
        output=r.output,
        created_at=r.created_at,
        started_at=r.started_at,
        finished_at=r.finished_at,
        progress=pb.Progress(**r.progress),
        error=r.error,
        config_hash=r.config_hash,
        run_digest=r.run_digest,
    )


MAX_REQUEST_ID = 256  # characters


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON can carry")


# A ListJobs page stops before this many bytes of jobs (clients accept 4 MiB by default; a
# job's spec may be up to 1 MiB), whatever page_size asks for.
MAX_LIST_BYTES = 3 * 1024 * 1024


class RolloutServicer(pb_grpc.RolloutServiceServicer):
    def __init__(self, manager: JobManager, streams: StreamBudget | None = None) -> None:
        from rollout.service.sweeps import SweepService

        self.manager = manager
        self.sweeps = SweepService(manager)
        self.streams = streams or StreamBudget(total=32, per_client=16)

    def _call(self, context: grpc.ServicerContext, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # every error becomes a status with its message
            context.abort(status_of(exc), str(exc))

    def SubmitJob(self, request, context):
        if len(request.request_id) > MAX_REQUEST_ID:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"request_id is {len(request.request_id)} characters; at most {MAX_REQUEST_ID}")  # fmt: skip
        try:
            spec = json_format.MessageToDict(request.spec)
        except RecursionError:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "spec is nested too deeply")
        except (ValueError, json_format.Error) as exc:  # NaN or an infinity in a number
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"spec holds a number JSON cannot carry: {exc}")  # fmt: skip
        record = self._call(context, self.manager.submit, spec, request.request_id or None)
        return to_proto(record)

    def GetJob(self, request, context):
        return to_proto(self._call(context, self.manager.get, request.job_id))

    def ListJobs(self, request, context):
        try:
            states = [pb.JobState.Name(s) for s in request.states]
        except ValueError:
            states = ["?"]
        if any(s not in STATES for s in states):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"states must be among {', '.join(STATES)}"
            )
        size = request.page_size or 50
        if not 1 <= size <= MAX_PAGE:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"page_size must be in [1, {MAX_PAGE}], got {size}",
            )
        token = request.page_token or "0"
        if not (token.isdigit() and len(token) <= 18):  # a job's sequence number, below 2^63
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"page_token {shorten(request.page_token)} is not valid",
            )
        after = int(token)
        records = self.manager.store.list(states, after, size + 1)
        more = len(records) > size
        jobs, total, last = [], 0, None
        for record in records[:size]:
            job = to_proto(record)
            if jobs and total + job.ByteSize() > MAX_LIST_BYTES:  # pages are bounded in bytes too
                more = True
                break
            jobs.append(job)
            total += job.ByteSize()
            last = record
        token = str(last.seq) if more and last is not None else ""
        return pb.ListJobsResponse(jobs=jobs, next_page_token=token)

    def CancelJob(self, request, context):
        return to_proto(self._call(context, self.manager.cancel, request.job_id))

    def WatchJob(self, request, context) -> Iterator[Any]:
        record = self._call(context, self.manager.get, request.job_id)
        with self.streams.slot(context, "WatchJob"):
            last = to_proto(record)
            yield pb.JobEvent(job=last)
            while record.state not in FINAL and context.is_active():
                self.manager.wait_for_change(1.0)
                record = self.manager.get(request.job_id)
                current = to_proto(record)
                if current != last:
                    last = current
                    yield pb.JobEvent(job=current)

    def GetRunManifest(self, request, context):
        from dataclasses import asdict
        from pathlib import Path

        record = self._call(context, self.manager.get, request.job_id)
        manifest = Manifest.load(Path(record.output))  # the snapshot with the journal applied
        if manifest is None:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"job {record.job_id} has no manifest yet ({record.state})",
            )
        data = json.loads(json.dumps(asdict(manifest)))
        return pb.RunManifest(manifest=json_format.ParseDict(data, struct_pb2.Struct()))

    # -- sweeps ---------------------------------------------------------------------------------
    def _sweep(self, sweep_id: str) -> Any:
        record, state, jobs = self.sweeps.get(sweep_id)
        cells = []
        for c, job in zip(record.cells, jobs, strict=True):
            cells.append(pb.Sweep.Cell(
                cell_id=c["cell_id"], settings_json=json.dumps(c["settings"], ensure_ascii=False),
                job_id=job.job_id, state=pb.JobState.Value(job.state), progress=pb.Progress(**job.progress),
                error=job.error, run_digest=job.run_digest,
            ))  # fmt: skip
        return pb.Sweep(sweep_id=record.sweep_id, state=pb.JobState.Value(state), output=record.output,
                        cells=cells, digest=record.digest, request_id=record.request_id or "",
                        report_markdown=record.report.get("markdown", ""),
                        rows_total=sum(c.get("rows_total", 0) for c in record.cells))  # fmt: skip

    def SubmitSweep(self, request, context):
        if len(request.request_id) > MAX_REQUEST_ID:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"request_id is {len(request.request_id)} characters; at most {MAX_REQUEST_ID}")  # fmt: skip
        try:
            spec = json.loads(request.spec_json, parse_constant=_no_constant)
        except (RecursionError, ValueError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"spec_json is not JSON a sweep can be read from: {shorten(str(exc))}")  # fmt: skip
        if not isinstance(spec, dict):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "spec_json must hold a JSON object")
        record = self._call(context, self.sweeps.submit, spec, request.output, request.request_id or None)  # fmt: skip
        return self._call(context, self._sweep, record.sweep_id)

    def GetSweep(self, request, context):
        return self._call(context, self._sweep, request.sweep_id)

    def CancelSweep(self, request, context):
        self._call(context, self.sweeps.cancel, request.sweep_id)
        return self._call(context, self._sweep, request.sweep_id)

    def WatchSweep(self, request, context) -> Iterator[Any]:
        last = self._call(context, self._sweep, request.sweep_id)
        with self.streams.slot(context, "WatchSweep"):
            yield last
            final = {pb.JobState.Value(s) for s in FINAL}
            while last.state not in final and context.is_active():
                self.manager.wait_for_change(1.0)
                current = self._call(context, self._sweep, request.sweep_id)
                if current != last:
                    last = current
                    yield current

    # -- audits ---------------------------------------------------------------------------------
    def AuditRuns(self, request, context) -> Iterator[Any]:
        from rollout.audit.audit import audit_runs

        a = self._call(context, self.manager.run_dir, request.a, "a")
        b = self._call(context, self.manager.run_dir, request.b, "b")
        with self.streams.slot(context, "AuditRuns"):
            yield from self._stream(
                context, lambda progress, cancel: audit_runs(
                    a, b, request.max_examples or 50, progress, cancel))  # fmt: skip

    def VerifyRun(self, request, context) -> Iterator[Any]:
        from rollout.audit.verify import Sample, verify_run

        run = self._call(context, self.manager.run_dir, request.run, "run")
        sample = Sample(
            fraction=request.sample or None, rows=request.rows or None, seed=request.seed
        )
        self._call(context, sample.count, run.manifest.rows or 0)  # a bad sample fails here
        with self.streams.slot(context, "VerifyRun"):
            yield from self._stream(
                context, lambda progress, cancel: verify_run(
                    run, sample, ray_address=self.manager.ray_address,
                    max_examples=request.max_examples or 50, progress=progress, cancel=cancel))  # fmt: skip

    def _stream(self, context: grpc.ServicerContext, work) -> Iterator[Any]:
        """Run `work(progress, cancel)` in a thread; stream its progress, then its report."""
        events: queue.Queue = queue.Queue()
        cancel = threading.Event()
        context.add_callback(cancel.set)  # the client went away or cancelled

        def progress(phase: str, done: int, total: int) -> None:
            events.put(
                pb.AuditEvent(progress=pb.AuditProgress(phase=phase, done=done, total=total))
            )

        def target() -> None:
            try:
                events.put(work(progress, cancel))
            except BaseException as exc:  # handed to the RPC thread, which reports it
                events.put(exc)

        threading.Thread(target=target, name="rollout-audit", daemon=True).start()
        while True:
            item = events.get()
            if isinstance(item, BaseException):
                context.abort(status_of(item), str(item))
            if isinstance(item, pb.AuditEvent):
                yield item
                continue
            yield pb.AuditEvent(report=report_to_proto(item))
            return
