"""Files under the data roots, opened without following symlinks: the check is the open.

A path checked against the roots and then opened by name can be swapped for a symlink in
between (time of check, time of use). Here the path is resolved once, checked, and then
opened one component at a time from the root's own descriptor with `O_NOFOLLOW`
(`openat`): a component that is a symlink by then is refused, not followed. What the
caller gets is a descriptor, or a `/proc/self/fd/N` path to it on Linux, which names
the opened directory itself whatever happens to its name afterwards.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from rollout.errors import AccessError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
_FILE_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
PROC_FD = Path("/proc/self/fd")


def _split(parameter: str, path: str, roots: Sequence[str]) -> tuple[str, list[str]]:
    """The root `path` lies under (after resolving symlinks once) and the components below it."""
    real = os.path.realpath(path)
    for root in roots:
        rel = os.path.relpath(real, root)
        if rel == ".":
            return root, []
        if not rel.startswith(".."):
            return root, rel.split(os.sep)
    raise AccessError(parameter, path, f"resolves to {real}, outside the data roots ({', '.join(roots)})")  # fmt: skip


def open_under_roots(
    parameter: str, path: str, roots: Sequence[str], *, directory: bool = False,
    create: bool = False,
) -> int:  # fmt: skip
    """A descriptor of `path` (a file, or a directory with `directory`; missing directories
    made with `create`), opened from its root's descriptor one component at a time without
    following any symlink; AccessError if a component is a symlink when it is opened or
    the path lies outside the roots. The caller closes the descriptor."""
    root, parts = _split(parameter, path, roots)
    fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)  # the roots were resolved at start-up
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            as_dir = directory or not last
            if create and as_dir:
                with suppress(FileExistsError):
                    os.mkdir(part, 0o777, dir_fd=fd)
            try:
                child = os.open(part, _DIR_FLAGS if as_dir else _FILE_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, fd):
                    where = os.path.join(root, *parts[: i + 1])
                    raise AccessError(
                        parameter, path,
                        f"{where} is a symlink (it changed after the path was checked); files "
                        "under the data roots are opened without following symlinks",
                    ) from None  # fmt: skip
                raise
            os.close(fd)
            fd = child
        if not directory and not stat.S_ISREG(os.fstat(fd).st_mode):
            raise AccessError(parameter, path, "is not a regular file")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def fd_path(fd: int) -> str | None:
    """A path naming the open descriptor `fd` itself (Linux's /proc), or None where there is none."""
    path = PROC_FD / str(fd)
    return str(path) if PROC_FD.is_dir() and os.path.exists(path) else None


@contextmanager
def confined_dir(parameter: str, path: str, roots: Sequence[str] | None) -> Iterator[Path]:
    """`path` (a directory, made if missing) as a path that keeps naming the directory opened
    under the roots, whatever later happens to its name; `path` itself without roots."""
    if not roots:
        yield Path(path)
        return
    fd = open_under_roots(parameter, path, roots, directory=True, create=True)
    try:
        pinned = fd_path(fd)
        yield Path(pinned) if pinned else Path(path)
    finally:
        os.close(fd)
