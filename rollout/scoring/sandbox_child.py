"""The sandboxed side of `code_tests`: run as `python -I -S sandbox_child.py CONFIG_JSON`
with the program in `program.py` of the current (temporary) folder. Standard library only:
it must not import rollout, and runs nothing of the program until it is locked down.

In this order: resource limits; a network namespace of its own (no interface but a down
loopback) where the kernel allows; root's privileges dropped to `nobody`; an audit hook
that ends the process (exit 121) at the first attempt to start a process, open a socket,
load a C library, write outside the folder, or search the heap (`gc`); then the program. The verdict goes to the parent on the descriptor `fd` names: the nonce (read from stdin before the
program starts) when the program ran to its end, or the name of the exception it raised.
"""

import ctypes
import errno
import json
import os
import resource
import sys

VIOLATION = 121
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
_BLOCKED = {
    "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
    "os.kill", "os.killpg", "subprocess.Popen", "pty.spawn", "socket.__new__",
    "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.sendto",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
    "gc.get_objects", "gc.get_referrers",
    "gc.get_referents", "os.chroot", "os.setuid", "os.setgid", "resource.setrlimit",
    "sys.setrecursionlimit",
}  # fmt: skip
_WRITES = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
           "os.symlink", "os.link", "os.truncate", "os.utime", "shutil.rmtree"}  # fmt: skip
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _limits(cfg: dict) -> None:
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu_s"], cfg["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_AS, (cfg["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["file_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _isolate(cfg: dict) -> str:
    """A network namespace of its own, then not root: what this kernel allowed, in words."""
    done = []
    libc = ctypes.CDLL(None, use_errno=True)
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if libc.unshare(flags) == 0:
        done.append("netns")
    if os.geteuid() == 0 and cfg["uid"] is not None:
        os.setgroups([])
        os.setgid(cfg["uid"])
        os.setuid(cfg["uid"])
        resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"],) * 2)
        done.append("nobody")
    return ",".join(done)


def _hook(folder: str, out):
    def inside(path) -> bool:
        if isinstance(path, int):
            return True  # a descriptor already open
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == folder or real.startswith(folder + os.sep)

    def audit(event, args):
        bad = event in _BLOCKED
        if not bad and event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            bad = bool(writing) and not inside(path)
        elif not bad and event in _WRITES:
            bad = not all(inside(a) for a in args[:2] if isinstance(a, str | bytes | os.PathLike))
        elif not bad and event == "import" and args and args[0] in ("_posixsubprocess", "_ctypes"):
            bad = True
        if bad:
            try:
                os.write(out, f"error:sandbox refused {event}".encode())
            finally:
                os._exit(VIOLATION)

    return audit


def main() -> None:
    cfg = json.loads(sys.argv[1])
    nonce = sys.stdin.read()
    sys.stdin.close()
    out = cfg["fd"]
    folder = os.path.realpath(os.getcwd())
    _limits(cfg)
    _isolate(cfg)
    source = open("program.py", encoding="utf-8").read()  # noqa: SIM115
    code = compile(source, "program.py", "exec")
    sys.addaudithook(_hook(folder, out))
    try:
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:  # an exit before the end is not a pass (HumanEval's harness agrees)
        os.write(out, f"failed:SystemExit({exc.code!r})"[:200].encode())
        os._exit(1)
    except BaseException as exc:  # noqa: BLE001 - the program's own error is its verdict
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:  # Python ignores SIGXFSZ
            os.write(out, f"error:output over {cfg['file_mb']} MiB".encode())
        else:
            os.write(out, f"failed:{type(exc).__name__}".encode())
        os._exit(1)
    sys.stdout.flush()
    os.write(out, nonce.encode())
    os._exit(0)


main()
