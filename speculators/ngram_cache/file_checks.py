"""Which lookup files are read at all, and whether a loaded cache fits a model.

Before a file is read whole: it must be a regular file, not plainly something else (a GGUF
model, text, a size or first record no cache can have), and small enough for this machine's
memory. After: every token id it names must lie in the model's vocabulary, since llama.cpp
aborts on one that does not. Reads files and ``/proc``; changes nothing.
"""

from __future__ import annotations

import codecs
import itertools
import os
import stat
from typing import TYPE_CHECKING

import numpy as np

from .errors import LookupFileRefused, NotALookupCacheError, VocabMismatchError
from .file_format import _HEADER_WORDS, _unpack_words
from .keys import LLAMA_TOKEN_NULL, NGRAM_MAX

if TYPE_CHECKING:
    from .table import NgramCache

#: a lookup file larger than this is never loaded, whatever the memory: the file is parsed in
#: Python (~0.25 s per MiB), so 1 GiB already takes minutes
MAX_FILE_BYTES = 1 << 30
#: memory a loaded cache takes per byte of its file, with room to spare (the reading and
#: parsing peak measured about 18 bytes per byte of a file of one-entry records, the cache itself 16)
LOAD_MEMORY_FACTOR = 32
#: the first bytes of a GGUF file (a model, not a cache)
GGUF_MAGIC = b"GGUF"
#: how much of a file is read to tell what it is
_SNIFF_BYTES = 4096


def _available_memory() -> int | None:
    """Bytes of memory this process could still take, as far as can be told cheaply (None: unknown).

    Linux: ``MemAvailable`` of ``/proc/meminfo``, less where a cgroup (v2) limit leaves less;
    elsewhere the free physical pages.
    """
    avail = None
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            return None
    try:
        with open("/sys/fs/cgroup/memory.max", "rb") as f:
            cap = f.read().strip()
        if cap != b"max":
            with open("/sys/fs/cgroup/memory.current", "rb") as f:
                used = int(f.read().strip())
            avail = min(avail, max(0, int(cap) - used))
    except (OSError, ValueError):
        pass
    return avail


def load_limit() -> int:
    """The largest lookup file loaded now: :data:`MAX_FILE_BYTES`, less where the memory
    available is less than :data:`LOAD_MEMORY_FACTOR` times that."""
    avail = _available_memory()
    if avail is None:
        return MAX_FILE_BYTES
    return min(MAX_FILE_BYTES, avail // LOAD_MEMORY_FACTOR)


def _looks_like_text(head: bytes, whole: bool) -> bool:
    """No NUL byte and valid UTF-8 (a character cut at the end of ``head`` allowed unless ``whole``)."""
    if b"\0" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=whole)
    except UnicodeDecodeError:
        return False
    return True


def _human_bytes(n: int) -> str:
    """``123 bytes``, ``4.0 KiB``, ..., ``8.0 GiB``."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"  # pragma: no cover


def check_lookup_head(head: bytes, size: int, source: str = "<file>") -> None:
    r"""Rule a file out as a lookup cache from its size and first bytes, or let it pass.

    ``head`` is the first ``min(size, 4096)`` bytes. Raises :class:`NotALookupCacheError`,
    saying what the file is where that can be told, when:

    * it begins with the GGUF magic (a model);
    * it is text: no NUL byte and valid UTF-8 (every lookup file has a NUL byte in its first four:
      the first token id is below 2**24);
    * it is larger than ``head`` (so reading it whole costs more than this look) and its size is
      not a multiple of 4 (the format is 4-byte integers), or its first record is malformed: an
      n-gram not of 1 to 4 ids >= 0 padded with -1, a token count <= 0, or more entries than the
      file holds. (A file within ``head`` is left to the full parse, as cheap and more precise.)

    A file that passes may still be damaged further on: the full parse decides.

    >>> check_lookup_head(b"", 0)                                  # empty: an empty cache
    >>> check_lookup_head(b"GGUF\x03\0\0\0", 6 << 30, "m.gguf")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    speculators.ngram_cache.errors.NotALookupCacheError: m.gguf: not a ... cache: it is a GGUF model file (6.0 GiB)
    >>> check_lookup_head(b"once upon a time", 16, "c.txt")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    speculators.ngram_cache.errors.NotALookupCacheError: c.txt: not a llama.cpp lookup cache: it is text ...
    >>> one = b"\x07\0\0\0" + b"\xff" * 12 + b"\1\0\0\0" + b"\x08\0\0\0\1\0\0\0"  # (7,) -> {8: 1}
    >>> check_lookup_head(one, len(one))                # a whole file: the parse decides
    >>> check_lookup_head(one, 8 << 30)                 # plausible (its size is for the caller to judge)
    >>> check_lookup_head(one, (8 << 30) + 2, "big.bin")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    speculators.ngram_cache.errors.NotALookupCacheError: big.bin: ...: its size (8589934594 bytes) is not a multiple of 4 ...
    """
    def refuse(what: str) -> NotALookupCacheError:
        return NotALookupCacheError(f"{source}: not a llama.cpp lookup cache: {what}")

    if head.startswith(GGUF_MAGIC):
        raise refuse(f"it is a GGUF model file ({_human_bytes(size)})")
    if size == 0:
        return
    if _looks_like_text(head, whole=len(head) >= size):
        raise refuse("it is text (to draft from a text corpus, build a static cache from it with "
                     "'draftlight lookup create FILE')")
    if len(head) >= size:
        return
    if size % 4:
        raise refuse(f"its size ({size} bytes) is not a multiple of 4 (the format is 4-byte integers)")
    if len(head) < 4 * _HEADER_WORDS:
        raise refuse(f"only {len(head)} of its {size} bytes could be read")
    w = _unpack_words(head[:4 * _HEADER_WORDS])
    key, nt = w[:NGRAM_MAX], w[NGRAM_MAX]
    n_real = next((i for i, t in enumerate(key) if t == LLAMA_TOKEN_NULL), NGRAM_MAX)
    if n_real == 0 or any(t < 0 for t in key[:n_real]) or any(t != LLAMA_TOKEN_NULL for t in key[n_real:]):
        raise refuse(f"its first record does not begin with an n-gram (read {tuple(key)})")
    if nt <= 0 or 4 * (_HEADER_WORDS + 2 * nt) > size:
        raise refuse(f"its first record declares {nt} tokens, which a file of {size} bytes cannot hold")


def read_lookup_file(path: str | os.PathLike, max_bytes: int | None = None) -> tuple[bytes, os.stat_result]:
    """The bytes of a lookup file and its ``fstat``, read whole only once cheap checks pass.

    Before more than 4 KiB is read: it must be a regular file (a folder, a device such as
    ``/dev/zero`` or a pipe is refused with :class:`LookupFileRefused`), pass
    :func:`check_lookup_head` (else :class:`NotALookupCacheError`), and be no larger than
    ``max_bytes`` (default :func:`load_limit`; else :class:`LookupFileRefused`). So pointing a
    cache path at a multi-GB model or corpus costs one small read, never the machine's memory.
    OSError (FileNotFoundError, ...) as ``open`` raises it.
    """
    source = os.fspath(path)
    if not stat.S_ISREG(os.stat(source).st_mode):   # before open: opening a pipe would block
        raise LookupFileRefused(f"{source}: not a regular file")
    with open(source, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):             # replaced in between
            raise LookupFileRefused(f"{source}: not a regular file")
        size = st.st_size
        head = f.read(_SNIFF_BYTES)
        check_lookup_head(head, size, source)
        limit = load_limit() if max_bytes is None else max_bytes
        if size > limit:
            raise LookupFileRefused(
                f"{source}: {_human_bytes(size)} is more than a lookup cache can be loaded with here "
                f"(at most {_human_bytes(limit)}: {LOAD_MEMORY_FACTOR} bytes of memory per byte of file, "
                f"no more than {_human_bytes(MAX_FILE_BYTES)})")
        if len(head) >= size:
            return head, st
        f.seek(0)
        return f.read(), st


def vocab_violations(cache: "NgramCache", n_vocab: int) -> tuple[int, int | None]:
    """(entries that name a token outside the vocabulary, one such id) of ``cache``.

    An entry (n-gram, next token) is bad when its next token is not in ``0..n_vocab-1`` or its
    n-gram is not 1 to 4 such ids padded with -1. The id given is the largest out of range (the
    smallest when all are negative); None when only the padding is wrong.

    >>> from speculators.ngram_cache import NgramCache
    >>> c = NgramCache()
    >>> c.add((1, 2), 3); c.add((1, 2), 70_000); c.add((9,), 4); c.add((5, 70_001), 6)
    >>> vocab_violations(c, 32_000)
    (2, 70001)
    >>> vocab_violations(c, 100_000)
    (0, None)
    """
    m = cache._map
    if not m:
        return 0, None
    keys = np.fromiter(itertools.chain.from_iterable(m), dtype=np.int64,
                       count=NGRAM_MAX * len(m)).reshape(-1, NGRAM_MAX)
    sizes = np.fromiter(map(len, m.values()), dtype=np.int64, count=len(m))
    toks = np.fromiter(itertools.chain.from_iterable(m.values()), dtype=np.int64, count=int(sizes.sum()))
    pad = keys == LLAMA_TOKEN_NULL
    key_in = (keys >= 0) & (keys < n_vocab)
    key_bad = ~(key_in | pad).all(axis=1) | pad[:, 0] | (pad[:, :-1] & ~pad[:, 1:]).any(axis=1)
    tok_bad = (toks < 0) | (toks >= n_vocab)
    n_bad = int((tok_bad | np.repeat(key_bad, sizes)).sum())
    if not n_bad:
        return 0, None
    out = np.concatenate([keys[~(key_in | pad)], toks[tok_bad]])
    if not len(out):
        return n_bad, None
    return n_bad, int(out.max()) if out.max() >= n_vocab else int(out.min())


def check_vocab(cache: "NgramCache", n_vocab: int, source: str = "<cache>") -> None:
    """Raise :class:`VocabMismatchError` when ``cache`` names a token outside ``0..n_vocab-1``.

    Such a cache was built for another vocabulary (or is damaged); a drafted id out of range
    would reach llama.cpp, which aborts the process on it.

    >>> from speculators.ngram_cache import NgramCache
    >>> c = NgramCache(); c.add((1,), 5)
    >>> check_vocab(c, 4, "x.bin")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    speculators.ngram_cache.errors.VocabMismatchError: x.bin: 1 of its 1 entries name token ids outside ... (such as 5): ...
    """
    n_bad, example = vocab_violations(cache, n_vocab)
    if n_bad:
        such = f" (such as {example})" if example is not None else " (misplaced -1 padding)"
        raise VocabMismatchError(
            f"{source}: {n_bad} of its {cache.n_entries} entries name token ids outside this model's "
            f"vocabulary of {n_vocab} tokens{such}: it was built for another model's vocabulary, "
            f"or is damaged", n_bad, n_vocab)
