"""Atomic file writes: a temp file in the same folder, fsync, rename.

Text is always written as UTF-8, whatever the locale says (under ``LANG=C`` Python's own default
would be ASCII, and an emoji in a chat would fail its export).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Write to ``path`` so that readers see the old file or the new one, never half.

    ``mode`` is ``"wb"`` or ``"w"``; a text file (``"w"``) is UTF-8. The file is readable by its
    owner only (mode 0600, as :func:`tempfile.mkstemp` makes it).

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_writer(d / "x.txt", "w") as f:
    ...     _ = f.write("hello")
    >>> (d / "x.txt").read_text(encoding="utf-8")
    'hello'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        with contextlib.suppress(OSError):
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_writer(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """:func:`atomic_writer` for ``text``, encoded as UTF-8."""
    with atomic_writer(path, "w") as f:
        f.write(text)
