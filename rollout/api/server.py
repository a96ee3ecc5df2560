"""`rollout serve`: the gRPC server (loopback by default), with health checking and reflection."""

from __future__ import annotations

import hmac
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rollout.api.servicer import RolloutServicer, pb, pb_grpc
from rollout.api.streams import StreamBudget
from rollout.service.manager import JobManager
from rollout.service.store import JobStore

MAX_MESSAGE_BYTES = 1 << 20  # a job spec larger than 1 MiB is refused
SERVICE_NAME = "rollout.v1.RolloutService"
_OPEN_METHODS = ("/grpc.health.v1.Health/",)  # probes carry no token


_STREAMS = frozenset({"WatchJob", "WatchSweep", "AuditRuns", "VerifyRun"})  # server-streaming


class TokenAuth(grpc.ServerInterceptor):
    """Every call (but health checks) must carry `authorization: Bearer <token>`."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.unary_stream_rpc_method_handler(deny)

    def intercept_service(self, continuation, details):
        if details.method.startswith(_OPEN_METHODS):
            return continuation(details)
        sent = dict(details.invocation_metadata).get("authorization", "")
        if hmac.compare_digest(sent.encode(), self._expected):
            return continuation(details)
        return self._deny_stream if details.method.rsplit("/", 1)[-1] in _STREAMS else self._deny


def parsed_submit(servicer: RolloutServicer) -> grpc.RpcMethodHandler:
    """SubmitJob with its request parsed in the handler. gRPC parses requests before a
    handler runs and answers INTERNAL when protobuf refuses one (a spec nested past
    protobuf's depth limit, or malformed bytes); parsed here, such a request is
    INVALID_ARGUMENT, like every other malformed request."""
    from google.protobuf.message import DecodeError

    def handle(raw: bytes, context: grpc.ServicerContext):
        try:
            request = pb.SubmitJobRequest.FromString(raw)
        except DecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"the request cannot be parsed ({exc}): a malformed message, or a spec "
                          "nested deeper than protobuf allows (about 30 levels)")  # fmt: skip
        return servicer.SubmitJob(request, context)

    return grpc.unary_unary_rpc_method_handler(
        handle, request_deserializer=None, response_serializer=pb.Job.SerializeToString
    )


class _Registrar:
    """The server as the generated add_*_to_server sees it, with some of its method
    handlers replaced (registered handlers are looked up before generic ones)."""

    def __init__(self, server: grpc.Server, replace: dict[str, grpc.RpcMethodHandler]) -> None:
        self._server, self._replace = server, replace

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self._server.add_registered_method_handlers(service, {**handlers, **self._replace})


class Server:
    def __init__(
        self,
        address: str,
        state_dir: Path,
        data_roots: list[Path],
        max_concurrent_jobs: int = 1,
        ray_address: str | None = None,
        token: str | None = None,
        tls: tuple[bytes, bytes] | None = None,
        max_streams: int = 32,
        max_streams_per_client: int = 16,
        allowed_scorers: tuple[str, ...] = (),
        metrics_address: str | None = None,
    ) -> None:
        self.store = JobStore(state_dir / "jobs.sqlite")
        self.manager = JobManager(self.store, data_roots, max_concurrent_jobs, ray_address,
                                  allowed_scorers)  # fmt: skip
        self.streams = StreamBudget(max_streams, max_streams_per_client)
        self.metrics_address, self.metrics_port = metrics_address, None
        self.grpc = grpc.server(
            # every stream slot plus a reserve that streams never take (rollout/api/streams.py)
            futures.ThreadPoolExecutor(max_workers=self.streams.workers),
            interceptors=[TokenAuth(token)] if token else [],
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        servicer = RolloutServicer(self.manager, self.streams)
        registrar = _Registrar(self.grpc, {"SubmitJob": parsed_submit(servicer)})
        pb_grpc.add_RolloutServiceServicer_to_server(servicer, registrar)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, self.grpc)
        if tls:
            creds = grpc.ssl_server_credentials([(tls[1], tls[0])])  # (key, cert)
            self.port = self.grpc.add_secure_port(address, creds)
        else:
            self.port = self.grpc.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"cannot listen on {address}")

    def start(self) -> list[str]:
        from rollout.runtime import cluster

        # The service owns the Ray driver: connect once, here, before taking jobs.
        cluster.connect(self.manager.ray_address)
        if self.metrics_address:
            from rollout.service.metrics import Metrics

            self.manager.metrics = Metrics(self.store)
            self.metrics_port = self.manager.metrics.serve(self.metrics_address)
        resumed = self.manager.start()
        self.grpc.start()
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return resumed

    def stop(self, grace: float = 2.0) -> None:
        for name in ("", SERVICE_NAME):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.manager.stop()
        self.grpc.stop(grace).wait()
        if self.manager.metrics is not None:
            self.manager.metrics.stop()
        self.store.close()


__all__ = ["Server", "pb"]
