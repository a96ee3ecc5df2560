"""Run inside another network namespace: knock on every given port of `host` as a stranger
would, with gRPC calls Ray serves and plain HTTP, and print what answered (JSON).

usage: ray_probe.py HOST TOKEN|- PORT [PORT ...]   (TOKEN: send it as Ray's bearer token)
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import urllib.error
import urllib.request

import grpc

# One method of each gRPC service Ray's processes serve (GCS, raylet and object manager,
# core workers), each answerable with an empty request.
METHODS = (
    "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo",
    "/ray.rpc.JobInfoGcsService/GetAllJobInfo",
    "/ray.rpc.ActorInfoGcsService/GetAllActorInfo",
    "/ray.rpc.InternalKVGcsService/InternalKVKeys",
    "/ray.rpc.NodeManagerService/GetNodeStats",
    "/ray.rpc.NodeManagerService/GetSystemConfig",
    "/ray.rpc.ObjectManagerService/Push",
    "/ray.rpc.CoreWorkerService/NumPendingTasks",
)


def grpc_codes(target: str, token: str | None) -> dict[str, str]:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    codes = {}
    with grpc.insecure_channel(target) as channel:
        for method in METHODS:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            try:
                call(b"", timeout=5, metadata=metadata)
                codes[method] = "OK"
            except grpc.RpcError as exc:
                codes[method] = exc.code().name
    return codes


def http_status(target: str, token: str | None, method: str = "POST", path: str = "/get_or_create_runtime_env") -> str:  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://{target}{path}", data=b"" if method == "POST" else None,
                                     headers=headers, method=method)  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return str(response.status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        return f"no HTTP: {type(exc).__name__}"


def main() -> None:
    host, token, ports = sys.argv[1], sys.argv[2], sys.argv[3:]
    token = None if token == "-" else token
    report = {}
    for port in ports:
        target = f"{host}:{port}"
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as exc:
            report[port] = {"reachable": False, "why": str(exc)}
            continue
        report[port] = {"reachable": True, "grpc": grpc_codes(target, token),
                        "http": http_status(target, token),
                        "http_get": http_status(target, token, "GET", "/metrics")}  # fmt: skip
    print(json.dumps(report))


if __name__ == "__main__":
    main()
