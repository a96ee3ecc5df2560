"""A Python client for the rollout gRPC service (what the CLI uses).

from rollout.client import RolloutClient
with RolloutClient("127.0.0.1:50051") as client:
    job = client.submit(spec_dict)
    for update in client.watch(job.job_id):
        print(update.state, update.progress.shards_done)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2

from rollout.api.proto import modules

pb, pb_grpc = modules()
DEFAULT_ADDRESS = "127.0.0.1:50051"
FINAL_STATES = ("SUCCEEDED", "FAILED", "CANCELLED")


class RolloutClient:
    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        root_cert: bytes | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.address = address or os.environ.get("ROLLOUT_SERVER", DEFAULT_ADDRESS)
        if token is None and os.environ.get("ROLLOUT_TOKEN_FILE"):
            token = Path(os.environ["ROLLOUT_TOKEN_FILE"]).read_text().strip()
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        if root_cert is not None:
            self._channel = grpc.secure_channel(
                self.address, grpc.ssl_channel_credentials(root_cert)
            )
        else:
            self._channel = grpc.insecure_channel(self.address)
        self._stub = pb_grpc.RolloutServiceStub(self._channel)
        self.timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _kw(self) -> dict[str, Any]:
        return {"metadata": self._metadata, "timeout": self.timeout}

    def submit(self, spec: dict[str, Any], request_id: str | None = None) -> Any:
        if isinstance(spec.get("job_seed"), int):  # a Struct number is a double: send it exactly
            spec = {**spec, "job_seed": str(spec["job_seed"])}
        req = pb.SubmitJobRequest(
            spec=json_format.ParseDict(spec, struct_pb2.Struct()), request_id=request_id or ""
        )
        return self._stub.SubmitJob(req, **self._kw())

    def get(self, job_id: str) -> Any:
        return self._stub.GetJob(pb.GetJobRequest(job_id=job_id), **self._kw())

    def list(self, states: list[str] | None = None, page_size: int = 100) -> Iterator[Any]:
        token = ""
        while True:
            req = pb.ListJobsRequest(
                states=[pb.JobState.Value(s) for s in states or []],
                page_size=page_size,
                page_token=token,
            )
            resp = self._stub.ListJobs(req, **self._kw())
            yield from resp.jobs
            token = resp.next_page_token
            if not token:
                return

    def cancel(self, job_id: str) -> Any:
        return self._stub.CancelJob(pb.CancelJobRequest(job_id=job_id), **self._kw())

    def watch(self, job_id: str) -> Iterator[Any]:
        """The job now, then each change, until it ends."""
        for event in self._stub.WatchJob(
            pb.WatchJobRequest(job_id=job_id), metadata=self._metadata
        ):
            yield event.job

    # -- sweeps -------------------------------------------------------------------------------
    def submit_sweep(self, spec: dict[str, Any], output: str, request_id: str | None = None) -> Any:
        """Submit a sweep (its base job spec inline); the Sweep message."""
        req = pb.SubmitSweepRequest(spec_json=json.dumps(spec, ensure_ascii=False), output=output,
                                    request_id=request_id or "")  # fmt: skip
        return self._stub.SubmitSweep(req, **self._kw())

    def get_sweep(self, sweep_id: str) -> Any:
        return self._stub.GetSweep(pb.SweepRequest(sweep_id=sweep_id), **self._kw())

    def cancel_sweep(self, sweep_id: str) -> Any:
        return self._stub.CancelSweep(pb.SweepRequest(sweep_id=sweep_id), **self._kw())

    def watch_sweep(self, sweep_id: str) -> Iterator[Any]:
        """The sweep now, then each change, until every cell has ended."""
        yield from self._stub.WatchSweep(
            pb.SweepRequest(sweep_id=sweep_id), metadata=self._metadata
        )

    def manifest(self, job_id: str) -> dict[str, Any]:
        resp = self._stub.GetRunManifest(pb.GetRunManifestRequest(job_id=job_id), **self._kw())
        return json_format.MessageToDict(resp.manifest)

    def audit(self, a: str, b: str, max_examples: int = 50, progress: Any = None) -> Any:
        """Compare two finished runs (job ids or run directories on the server); returns an
        rollout.audit.report.AuditReport. `progress(phase, done, total)` sees each update."""
        req = pb.AuditRunsRequest(a=a, b=b, max_examples=max_examples)
        return _report(self._stub.AuditRuns(req, metadata=self._metadata), progress)

    def verify(
        self,
        run: str,
        sample: float | None = None,
        rows: int | None = None,
        seed: int = 0,
        max_examples: int = 50,
        progress: Any = None,
    ) -> Any:
        """Regenerate a sample of a finished run on the server and compare; an AuditReport."""
        req = pb.VerifyRunRequest(run=run, sample=sample or 0.0, rows=rows or 0, seed=seed,
                                  max_examples=max_examples)  # fmt: skip
        return _report(self._stub.VerifyRun(req, metadata=self._metadata), progress)

    def health(self) -> str:
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=self.timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def wait_until_serving(address: str, timeout: float = 120.0,
                       alive: Callable[[], bool] = lambda: True) -> bool:  # fmt: skip
    """Poll the health check at `address` until it answers SERVING (True), `timeout`
    seconds pass or `alive()` turns false, e.g. the server process exited (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and alive():
        try:
            with RolloutClient(address, timeout=2) as probe:
                if probe.health() == "SERVING":
                    return True
        except grpc.RpcError:  # not listening yet
            time.sleep(0.3)
    return False


def state_name(job: Any) -> str:
    return pb.JobState.Name(job.state)


def _report(events: Iterator[Any], progress: Any) -> Any:
    from rollout.audit.report import AuditReport

    for event in events:
        if event.HasField("progress") and progress is not None:
            progress(event.progress.phase, event.progress.done, event.progress.total)
        if event.HasField("report"):
            data = json_format.MessageToDict(
                event.report,
                preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True,
            )
            return AuditReport.from_dict(data)
    raise RuntimeError("the audit stream ended without a report")
