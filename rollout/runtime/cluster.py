"""The driver's connection to Ray: joining (or starting) a runtime, and telling a lost
runtime from a lost actor.

When the Ray runtime goes away under a job (its head node stopped, the network between
the driver and the cluster cut), every actor call fails at once. The pool asks
`reachable()` before it replaces a dead actor: if the cluster's GCS does not answer, the
job stops with ClusterLost instead of retrying shards into the void, its complete shards
are kept, and `disconnect()` drops the dead connection so that the next job (or the
rerun that resumes this one) joins the runtime afresh.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time

from rollout.errors import ClusterLost, ConfigError, first_line

log = logging.getLogger(__name__)

START_ATTEMPTS = 3  # tries to join or start Ray before the job fails
# An operator who runs Ray without authentication on a network they trust says so with this.
ALLOW_UNAUTHENTICATED = "ROLLOUT_ALLOW_UNAUTHENTICATED_RAY"


NO_AUTOSCALER_METRICS = ("AUTOSCALER_METRIC_PORT", "-1")


def secure_local_runtime() -> None:
    """Ray's token authentication for a runtime of our own. Ray's GCS and raylets listen on
    every interface (Ray 2.60 does not bind loopback even when asked), and without
    authentication anyone who reaches a port runs code as this user. A fresh random token,
    in this process's environment only (Ray's processes inherit it; nothing is written to
    ~/.ray), unless the environment already holds one."""
    has_token = bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"))
    if os.environ.get("RAY_AUTH_MODE") == "token" and has_token:
        return
    os.environ["RAY_AUTH_MODE"] = "token"
    if not has_token:
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    # Ray reads the mode and the token into its C++ config when it is imported: refresh
    # both, as Ray's own test utilities do (ray/_private/authentication_test_utils.py)
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def check_joined_cluster_auth(address: str) -> None:
    """Refuse to join a cluster without Ray's token authentication (docs/security.md)."""
    if os.environ.get("RAY_AUTH_MODE") == "token" or os.environ.get(ALLOW_UNAUTHENTICATED) == "1":
        return
    raise ConfigError(
        "--ray-address",
        address,
        "joining a Ray cluster without Ray's token authentication: anyone who reaches its "
        "ports can run code as its user. Start the cluster with RAY_AUTH_MODE=token and give "
        "this process RAY_AUTH_MODE=token and the token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH "
        f"or ~/.ray/auth_token); or, on a private network you trust, set {ALLOW_UNAUTHENTICATED}=1",
    )


def connect(address: str | None) -> None:
    """Join the Ray cluster at `address`, or start a local runtime (once per process)."""
    import ray

    if ray.is_initialized():
        return
    where = f"the Ray cluster at {address}" if address else "a local Ray runtime"
    if address:
        check_joined_cluster_auth(address)
    else:
        secure_local_runtime()
        # Ray's autoscaler monitor serves its metrics, unauthenticated, on every interface
        # once prometheus_client is importable (it is: rollout serve --metrics-address uses
        # it); a runtime of our own has nothing to autoscale, so that server is not started
        # (an invalid port makes the monitor skip it: ray/autoscaler/_private/monitor.py)
        os.environ.setdefault(NO_AUTOSCALER_METRICS[0], NO_AUTOSCALER_METRICS[1])
    for attempt in range(START_ATTEMPTS):
        try:
            if address:
                ray.init(address=address, logging_level="ERROR")
            else:
                ray.init(
                    address="local",  # a runtime of our own, never one `ray start` left behind
                    num_cpus=os.cpu_count(),
                    object_store_memory=256 * 1024 * 1024,
                    include_dashboard=False,
                    logging_level="ERROR",
                )
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises bare Exception on start-up timeouts
            # a busy machine can miss Ray's start-up deadlines: try again before giving up
            if ray.is_initialized():
                ray.shutdown()
            if attempt + 1 == START_ATTEMPTS:
                raise ClusterLost(f"cannot reach {where}: {first_line(exc)}") from None
            log.warning("%s did not start (%s); trying again", where, first_line(exc))
            time.sleep(2.0)


def pool_size(actors: int, cpus: float, gpus: float, shards: int) -> int:
    """How many engine actors a job starts: `actors`, but no more than its shards and than
    the connected cluster can hold at once. ConfigError, with the numbers, when no node can
    ever hold one actor (it would wait for resources forever)."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    have = [(float(r.get("CPU", 0)), float(r.get("GPU", 0))) for r in nodes]
    fits = [min(c // cpus if cpus else float("inf"), g // gpus if gpus else float("inf")) for c, g in have]  # fmt: skip
    if not any(f >= 1 for f in fits):
        shown = ", ".join(f"{c:g} CPU/{g:g} GPU" for c, g in have) or "none alive"
        raise ConfigError(
            "pool",
            f"cpus_per_actor={cpus:g}, gpus_per_actor={gpus:g}",
            f"an engine actor asks for {cpus:g} CPUs and {gpus:g} GPUs, and no node of the Ray "
            f"cluster has that (its nodes: {shown})",
        )
    return int(max(1, min(actors, shards, sum(fits))))


def gcs_address() -> str:
    import ray

    return ray.get_runtime_context().gcs_address


def reachable(timeout: float = 2.0) -> bool:
    """Whether the connected cluster's GCS accepts a connection."""
    host, _, port = gcs_address().rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def lost(cause: BaseException) -> ClusterLost:
    return ClusterLost(
        f"the Ray runtime at {gcs_address()} was lost mid-job (its GCS does not answer; "
        f"last error: {first_line(cause)}); complete shards are kept: run the job again "
        "once Ray is back, and it resumes"
    )


def disconnect() -> None:
    """Drop this process's connection to Ray (after it was lost), so that the next
    `connect` joins the runtime anew."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
