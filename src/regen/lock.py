"""One `regen run` per output directory.

The lock is an flock on `<out>/run.lock`, which the kernel releases when the holder dies, however
it dies (kill -9 included): a lock left by a dead process is simply taken over. The file holds
the holder's pid, so a second run can say who holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType

from regen.errors import StateError
from regen.safe import confined

LOCK_FILE = "run.lock"


class RunLock:
    """Exclusive use of an output directory by one process. Use as a context manager."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.path = out_dir / LOCK_FILE
        self._fd: int | None = None
        self.stale_pid: int | None = None
        """The pid of an earlier holder that died without releasing the lock, if any."""

    def acquire(self) -> None:
        confined(self.out_dir, self.path)  # the lock file is truncated: never through a link out
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StateError(f"{self.path.parent}: cannot use output directory: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"pid {holder}" if holder else "another process"
            raise StateError(
                f"{self.path.parent}: another regen run ({who}) is using this output directory;"
                " wait for it to finish, stop it, or pass another --out"
            ) from None
        # A pid left in the file is a holder that never released the lock: it died.
        self.stale_pid = _read_pid(fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise StateError(f"{self.path}: cannot write lock file: {exc}") from exc
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        # An empty file says "released cleanly"; the kernel drops the lock on close anyway.
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        return _pid_in(os.pread(fd, 32, 0))
    except OSError:
        return None


def _pid_in(data: bytes) -> int | None:
    text = data.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def running_holder(out_dir: Path) -> int | None:
    """The pid of the live process that holds `out_dir`, read without taking the lock (a
    clean release leaves the file empty; a killed holder leaves a pid that no longer runs)."""
    try:
        pid = _pid_in((out_dir / LOCK_FILE).read_bytes())
    except OSError:
        return None
    if pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by someone else
    return pid
