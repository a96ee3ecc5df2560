"""A budget for long-lived server streams (WatchJob, AuditRuns, VerifyRun).

A gRPC sync server gives each open stream a worker thread for as long as it lasts, so
streams alone could take every thread and starve unary calls and health checks (32 open
watchers did). Streams take a slot from a bounded budget, at most `per_client` from one
client host; a stream over budget is refused at once (RESOURCE_EXHAUSTED, naming the limit)
instead of queueing, and the server has `RESERVED_WORKERS` threads more than the budget, so
unary calls and health checks are always answered.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import grpc

RESERVED_WORKERS = 16  # threads that streams never take: unary calls and health checks


def client_host(peer: str) -> str:
    """The host part of a gRPC peer string ('ipv4:10.0.0.5:51234', 'ipv6:[::1]:5', 'unix:...')."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv6" and rest.startswith("["):
        return rest[1 : rest.index("]")]
    if kind == "ipv4":
        return rest.rpartition(":")[0]
    return peer


class StreamBudget:
    def __init__(self, total: int, per_client: int) -> None:
        if not 1 <= per_client <= total:
            raise ValueError(f"per-client streams must be in [1, {total}], got {per_client}")
        self.total, self.per_client = total, per_client
        self._lock = threading.Lock()
        self._open: Counter[str] = Counter()

    @property
    def workers(self) -> int:
        """The server's thread count: every stream slot, plus the reserve."""
        return self.total + RESERVED_WORKERS

    def open_streams(self) -> int:
        with self._lock:
            return sum(self._open.values())

    @contextmanager
    def slot(self, context: grpc.ServicerContext, what: str) -> Iterator[None]:
        """Hold a slot while the stream lasts; abort with RESOURCE_EXHAUSTED if none is free."""
        host = client_host(context.peer())
        with self._lock:
            used, mine = sum(self._open.values()), self._open[host]
            refused = None
            if used >= self.total:
                refused = f"the server has {used} of {self.total} streams open"
            elif mine >= self.per_client:
                refused = f"this client ({host}) has {mine} of its {self.per_client} streams open"
            if refused is None:
                self._open[host] += 1
        if refused is not None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{what}: {refused}; close one, or retry later")  # fmt: skip
        try:
            yield
        finally:
            with self._lock:
                self._open[host] -= 1
                if self._open[host] <= 0:
                    del self._open[host]
