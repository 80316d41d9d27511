"""An exclusive inter-process lock on a file: the cache folder's ``.lock``.

Holds :class:`FileLock` only. May touch the lock file (or lock directory) it is
given; imports nothing of the store but its exceptions.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time

from .errors import LockTimeout

try:  # pragma: no cover - platform dependent
    import fcntl as _fcntl
except ImportError:  # pragma: no cover
    _fcntl = None
try:  # pragma: no cover
    import msvcrt as _msvcrt
except ImportError:
    _msvcrt = None


class FileLock:
    """An exclusive inter-process lock on ``path`` (created if missing).

    ``fcntl.flock`` where available (released by the OS when the process
    dies, so a killed holder never wedges the folder), ``msvcrt.locking``
    on Windows, otherwise a lock directory ``path + ".d"`` that is taken
    over when older than ``stale_s``. Not re-entrant; threads of one
    process exclude each other too (each acquisition opens its own file).

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), ".lock")
    >>> with FileLock(p):
    ...     pass
    """

    def __init__(self, path: str | os.PathLike, timeout: float = 60.0, poll: float = 0.02,
                 stale_s: float = 300.0):
        self.path = os.fspath(path)
        self.timeout = timeout
        self.poll = poll
        self.stale_s = stale_s
        self._fd: int | None = None
        self._dir: str | None = None

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        deadline = time.monotonic() + self.timeout
        if _fcntl is not None or _msvcrt is not None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                while True:
                    try:
                        if _fcntl is not None:
                            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
                        else:  # pragma: no cover - Windows
                            os.lseek(fd, 0, os.SEEK_SET)
                            _msvcrt.locking(fd, _msvcrt.LK_NBLCK, 1)
                        break
                    except OSError as e:
                        if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK, errno.EDEADLK):
                            raise
                        if time.monotonic() >= deadline:
                            raise LockTimeout(f"the lookup cache lock {self.path} is held by another "
                                              f"process (waited {self.timeout:.0f} s)") from None
                        time.sleep(self.poll)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return
        d = self.path + ".d"  # pragma: no cover - fallback
        while True:  # pragma: no cover
            try:
                os.mkdir(d)
                self._dir = d
                return
            except FileExistsError:
                with contextlib.suppress(OSError):
                    if time.time() - os.stat(d).st_mtime > self.stale_s:
                        os.rmdir(d)
                        continue
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"the lookup cache lock {d} is held by another process") from None
                time.sleep(self.poll)

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                if _fcntl is not None:
                    _fcntl.flock(fd, _fcntl.LOCK_UN)
                elif _msvcrt is not None:  # pragma: no cover
                    os.lseek(fd, 0, os.SEEK_SET)
                    _msvcrt.locking(fd, _msvcrt.LK_UNLCK, 1)
            finally:
                os.close(fd)
        if self._dir is not None:  # pragma: no cover
            d, self._dir = self._dir, None
            with contextlib.suppress(OSError):
                os.rmdir(d)

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
