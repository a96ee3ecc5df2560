"""Ray's ports: whoever reaches them must not run code without Ray's token.

Ray's GCS and raylets listen on every interface (Ray 2.60 does not bind loopback even when
asked), so the service's own runtime runs with Ray's token authentication and a fresh
random token. The attacker here connects to the GCS at the machine's own non-loopback
address, as a host on the same network would, and tries to run a task.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollout.errors import ConfigError
from rollout.runtime import cluster

# A runtime as `rollout serve` starts it (cluster.connect), which prints its GCS address and
# token, then waits until its stdin closes.
OWNER = r"""
import json, os, sys
from rollout.runtime import cluster
cluster.connect(None)
import ray
@ray.remote
def own():
    return os.getpid()
ray.get(own.remote())
print(json.dumps({"gcs": cluster.gcs_address(), "mode": os.environ["RAY_AUTH_MODE"],
                  "token": os.environ["RAY_AUTH_TOKEN"]}), flush=True)
sys.stdin.read()
"""

ATTACK = r"""
import os, sys, ray
@ray.remote
def pwn():
    return "ran " + open("/proc/self/cmdline").read()[:20]
try:
    ray.init(address=sys.argv[1], logging_level="ERROR")
    print(ray.get(pwn.remote(), timeout=30))
except Exception as exc:
    print("REFUSED", type(exc).__name__, str(exc).splitlines()[0][:200])
"""


@pytest.fixture(scope="module")
def owned():
    """One runtime for the module's probes (starting one takes most of their time)."""
    with owned_runtime() as started:
        yield started


@contextlib.contextmanager
def owned_runtime():
    """A Ray runtime as `rollout serve` starts it, in a process of its own: (process, the
    GCS address, auth mode and token it printed); stopped on exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    owner = subprocess.Popen([sys.executable, "-c", OWNER], env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        yield owner, json.loads(owner.stdout.readline())
    finally:
        owner.stdin.close()
        owner.wait(60)
        time.sleep(0.5)


def _attack(gcs: str, home: Path, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run([sys.executable, "-c", ATTACK, gcs], env=clean | {"HOME": str(home)} | env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-300:]


def test_no_ray_port_runs_code_without_the_token(tmp_path, owned):
    owner, info = owned
    host = info["gcs"].rsplit(":", 1)[0]
    assert info["mode"] == "token" and len(info["token"]) == 64
    assert not host.startswith("127."), "the attack must come through a non-loopback address"
    attacker_home = tmp_path / "attacker"  # no ~/.ray/auth_token there
    attacker_home.mkdir()
    for how, extra in (("no authentication", {"RAY_AUTH_MODE": "disabled"}),
                       ("a guessed token", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 64})):  # fmt: skip
        got = _attack(info["gcs"], attacker_home, **extra)
        assert got.startswith("REFUSED"), f"with {how}: {got}"
    # the same attack with the token runs: the refusals above were for the token's sake
    got = _attack(info["gcs"], attacker_home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=info["token"])
    assert got.startswith("ran "), got


@pytest.fixture
def namespace():
    """Another network namespace on this machine, joined to it by a veth pair and routed to
    it: a host of its own, as a neighbour on the network would be. Needs root and `ip`."""
    name = f"rollout-probe-{os.getpid()}"
    host_end, ns_end = f"rp{os.getpid() % 100000}h", f"rp{os.getpid() % 100000}n"
    steps = [
        ["ip", "netns", "add", name],
        ["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end],
        ["ip", "link", "set", ns_end, "netns", name],
        ["ip", "addr", "add", "10.231.7.1/30", "dev", host_end],
        ["ip", "link", "set", host_end, "up"],
        ["ip", "netns", "exec", name, "ip", "addr", "add", "10.231.7.2/30", "dev", ns_end],
        ["ip", "netns", "exec", name, "ip", "link", "set", ns_end, "up"],
        ["ip", "netns", "exec", name, "ip", "route", "add", "default", "via", "10.231.7.1"],
    ]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as exc:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        pytest.skip(f"cannot make a network namespace here ({exc}); the non-loopback probe above still runs")  # fmt: skip
    yield name
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    subprocess.run(["ip", "link", "del", host_end], capture_output=True, timeout=30)


def _listening_ports(pid: int) -> list[int]:
    """The TCP ports the process `pid` and its descendants (Ray's GCS, raylet, agents and
    workers) listen on at a non-loopback address."""
    import psutil

    tree = {pid} | {p.pid for p in psutil.Process(pid).children(recursive=True)}
    return sorted({
        c.laddr.port for c in psutil.net_connections(kind="tcp")
        if c.pid in tree and c.status == psutil.CONN_LISTEN
        and not c.laddr.ip.startswith("127.") and c.laddr.ip != "::1"
    })  # fmt: skip


def _probe(namespace: str, host: str, token: str, ports: list[int]) -> dict:
    probe = Path(__file__).with_name("ray_probe.py")
    out = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, str(probe), host, token,
                          *map(str, ports)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_from_another_network_namespace_no_ray_port_answers_without_the_token(namespace, tmp_path, owned):  # fmt: skip
    owner, info = owned
    host = info["gcs"].rsplit(":", 1)[0]
    ports = _listening_ports(owner.pid)
    gcs_port = info["gcs"].rsplit(":", 1)[1]
    assert int(gcs_port) in ports and len(ports) >= 4, ports  # GCS, raylet, agent, workers
    stranger = _probe(namespace, host, "-", ports)
    for port, seen in stranger.items():
        assert seen["reachable"], f"port {port} is not reachable from the namespace: {seen}"
        answers = [*seen["grpc"].values(), seen["http"]]
        assert "OK" not in answers, f"port {port}: {seen}"
        # nothing is served over HTTP either, read-only pages included (GET /metrics)
        assert not seen["http"].startswith("2") and not seen["http_get"].startswith("2"), f"port {port}: {seen}"  # fmt: skip
        # each port was reached by a Ray service that refused for want of the token
        assert "UNAUTHENTICATED" in answers or seen["http"] == "401", f"port {port}: {seen}"
    # Ray's own client from the namespace is refused too
    attacker_home = tmp_path / "attacker"
    attacker_home.mkdir()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    got = subprocess.run(["ip", "netns", "exec", namespace, sys.executable, "-c", ATTACK, info["gcs"]],
                         env=clean | {"HOME": str(attacker_home), "RAY_AUTH_MODE": "disabled"},
                         capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    assert got.strip().splitlines()[-1].startswith("REFUSED"), got
    # with the token the same probe is served: the namespace does reach Ray
    friend = _probe(namespace, host, info["token"], ports)
    assert friend[gcs_port]["grpc"]["/ray.rpc.NodeInfoGcsService/GetAllNodeInfo"] == "OK"


def test_joining_a_cluster_without_authentication_is_refused(monkeypatch):
    import ray

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv(cluster.ALLOW_UNAUTHENTICATED, raising=False)
    # connect() must refuse before it ever calls ray.init (whatever this process holds)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init was called"))
    with pytest.raises(ConfigError, match=r"--ray-address.*without Ray's token authentication.*RAY_AUTH_MODE=token"):  # fmt: skip
        cluster.connect("127.0.0.1:9")
    monkeypatch.setenv(cluster.ALLOW_UNAUTHENTICATED, "1")
    cluster.check_joined_cluster_auth("127.0.0.1:9")  # the operator's explicit choice
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.delenv(cluster.ALLOW_UNAUTHENTICATED)
    cluster.check_joined_cluster_auth("127.0.0.1:9")
