"""llama.cpp's lookup-cache file format, byte for byte, and the atomic write that saves it.

The file is a bare sequence of records, little-endian, no header::

    int32 ngram[4]      tokens, padded with -1
    int32 ntokens       > 0
    ntokens x (int32 token, int32 count > 0)

This module turns an n-gram map into those bytes and back (refusing any flaw); which files are
read at all is :mod:`.file_checks`' job, the map itself :mod:`.table`'s.
"""

from __future__ import annotations

import os
import sys
from array import array
from typing import Iterable

from .errors import CorruptCacheError
from .keys import _INT32_MAX, NGRAM_MAX, Ngram
from .stl_order import _part_order

#: int32 words of one record header in a file: 4 tokens + the entry count.
_HEADER_WORDS = NGRAM_MAX + 1


def encode_records(m: dict[Ngram, dict[int, int]], keys: Iterable[Ngram], stl: bool) -> bytes:
    """The records of ``m``'s n-grams, in the order of ``keys``; with ``stl`` each record's tokens
    in libstdc++'s iteration order (else in insertion order). ValueError for an n-gram without
    tokens or a count that is not a positive int32."""
    words: list[int] = []
    ext = words.extend
    for key in keys:
        part = m[key]
        if not part:
            raise ValueError(f"n-gram {key} has no tokens")
        ext(key)
        words.append(len(part))
        tokens = _part_order(part) if stl and len(part) > 1 else part
        for t in tokens:
            c = part[t]
            if c <= 0 or c > _INT32_MAX:
                raise ValueError(f"count {c} of token {t} after n-gram {key} does not fit a positive int32")
            words.append(t)
            words.append(c)
    return _pack_words(words)


def decode_records(data: bytes | bytearray | memoryview, source: str = "<bytes>") -> dict[Ngram, dict[int, int]]:
    """The n-gram map the records of ``data`` hold, in file order; :class:`CorruptCacheError`
    (naming ``source`` and the byte) for a record cut short, a count <= 0, a token listed twice
    in a record, an n-gram listed twice, or stray bytes after the last record."""
    data = bytes(data)
    size = len(data)
    n_words, rem = divmod(size, 4)
    w = _unpack_words(data[: 4 * n_words])
    m: dict[Ngram, dict[int, int]] = {}
    p = 0
    while p < n_words:
        off = 4 * p
        if n_words - p < _HEADER_WORDS:
            raise CorruptCacheError(
                f"{source}: truncated record at byte {off}: {size - off} bytes left, "
                f"an n-gram and its token count need {4 * _HEADER_WORDS}")
        key = tuple(w[p:p + NGRAM_MAX])
        nt = w[p + NGRAM_MAX]
        if nt <= 0:
            raise CorruptCacheError(
                f"{source}: n-gram {key} at byte {off} has a token count of {nt} (must be > 0)")
        q = p + _HEADER_WORDS
        if n_words - q < 2 * nt:
            raise CorruptCacheError(
                f"{source}: entry cut in the middle: n-gram {key} at byte {off} declares {nt} "
                f"tokens ({8 * nt} bytes) but only {size - 4 * q} bytes follow")
        tokens = w[q:q + 2 * nt:2]
        counts = w[q + 1:q + 2 * nt:2]
        if min(counts) <= 0:
            j = next(j for j, c in enumerate(counts) if c <= 0)
            raise CorruptCacheError(
                f"{source}: token {tokens[j]} after n-gram {key} (byte {4 * (q + 2 * j)}) "
                f"has a count of {counts[j]} (must be > 0)")
        part = dict(zip(tokens, counts))
        if len(part) != nt:
            raise CorruptCacheError(
                f"{source}: n-gram {key} at byte {off} lists a token more than once")
        if key in m:
            raise CorruptCacheError(f"{source}: n-gram {key} appears twice (again at byte {off})")
        m[key] = part
        p = q + 2 * nt
    if rem:
        raise CorruptCacheError(
            f"{source}: truncated: {rem} stray bytes after the last complete record "
            f"(file size {size} is not a multiple of 4)")
    return m


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, rename it over ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    tmp = None
    for attempt in range(100):
        cand = os.path.join(directory, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            # 0o666 & ~umask, like the C++ ofstream
            fd = os.open(cand, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
        except FileExistsError:
            continue
        tmp = cand
        break
    if tmp is None:  # pragma: no cover
        raise OSError(f"cannot create a temporary file next to {path}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable where the platform allows
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(dfd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(dfd)


def _pack_words(words: list[int]) -> bytes:
    try:
        a = array("i", words)
    except OverflowError as e:
        raise ValueError(f"a token or count does not fit an int32: {e}") from None
    if a.itemsize != 4:  # pragma: no cover - exotic platforms
        import struct
        return struct.pack(f"<{len(words)}i", *words)
    if sys.byteorder != "little":  # pragma: no cover
        a.byteswap()
    return a.tobytes()


def _unpack_words(data: bytes) -> list[int]:
    a = array("i")
    if a.itemsize != 4:  # pragma: no cover
        import struct
        return list(struct.unpack(f"<{len(data) // 4}i", data))
    a.frombytes(data)
    if sys.byteorder != "little":  # pragma: no cover
        a.byteswap()
    return a.tolist()
