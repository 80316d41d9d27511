"""Static caches from text files, as ``llama-lookup-create`` builds them.

Reads corpus files as llama.cpp's ``-f`` reads a prompt (escapes processed,
one trailing newline dropped) and counts their 2-grams. Reads the files and
tokenizes with the model it is given; writes nothing (the store installs the result).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

from speculators.ngram_cache import NGRAM_STATIC, NgramCache

from .errors import BuildCancelled

#: text is tokenized in pieces of about this many characters (cut at a
#: line break) so that progress shows and cancel works on big files
_CHUNK_CHARS = 4 << 20


def _chunks(text: str, size: int = _CHUNK_CHARS) -> Iterable[str]:
    i, n = 0, len(text)
    while i < n:
        j = min(n, i + size)
        if j < n:
            k = text.rfind("\n", i, j)
            if k > i:
                j = k + 1
        yield text[i:j]
        i = j


_ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"', ord("\\"): b"\\"}
_HEX = frozenset(b"0123456789abcdefABCDEF")


def _hex2(a: int, b: int) -> int | None:
    """``strtol`` of the two characters ``a b`` in base 16 when it reads both (leading white
    space or a sign allowed), else None."""
    if b not in _HEX:
        return None
    if a in _HEX:
        return int(bytes((a, b)), 16)
    if a in b" \t\n\v\f\r+":
        return int(bytes((b,)), 16)
    if a == ord("-"):
        return -int(bytes((b,)), 16)
    return None


def process_escapes(data: bytes) -> bytes:
    r"""llama.cpp's escape processing of a prompt (``string_process_escapes``, on by default:
    ``--escape``): ``\n``, ``\r``, ``\t``, ``\'``, ``\"``, ``\\`` and ``\xHH`` become what they
    name; any other backslash stays as it is.

    >>> process_escapes(rb'a\nb \"q\" \\n \x41\x4 \q \\')
    b'a\nb "q" \\n A\\x4 \\q \\'
    >>> process_escapes(rb'\x 9\x-1\xg1')
    b'\t\xff\\xg1'
    """
    if b"\\" not in data:
        return data
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        c = data[i]
        if c != 0x5C or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        e = data[i + 1]
        rep = _ESCAPES.get(e)
        val = _hex2(data[i + 2], data[i + 3]) if rep is None and e == ord("x") and i + 3 < n else None
        if rep is not None:
            out += rep
            i += 2
        elif val is not None:
            out.append(val & 0xFF)   # as C's char(strtol(...))
            i += 4
        else:
            out += data[i:i + 2]
            i += 2
    return bytes(out)


def read_prompt_text(path: str | os.PathLike) -> str:
    r"""A text file as llama.cpp's ``-f``/``--file`` reads a prompt: the bytes as they are
    (no newline translation), less one trailing ``\n`` (``common/arg.cpp`` pops it), then with
    its escapes processed (:func:`process_escapes`), as llama.cpp's tools do by default.

    ``llama-lookup-create -f`` and ``llama-lookup-stats -f`` read their corpus this way,
    so counting the final newline would add one n-gram occurrence that they do not have,
    and a corpus that holds a written ``\n`` (a backslash and an n) would give other n-grams.
    """
    data = Path(path).read_bytes()
    if data.endswith(b"\n"):
        data = data[:-1]
    return process_escapes(data).decode("utf-8", "replace")


def build_static_cache(model, files: Sequence[str | os.PathLike],
                       progress: Callable[[int, int, str], None] | None = None,
                       cancel: Callable[[], bool] | None = None) -> tuple[NgramCache, int]:
    """``llama-lookup-create`` over several files: (cache, tokens read).

    Each file is tokenized as lookup-create tokenizes its prompt (BOS added
    when the model adds one, special tokens parsed) and its 2-grams
    (``LLAMA_NGRAM_STATIC``) counted; n-grams do not span files. Each file is read
    as ``-f`` reads it (:func:`read_prompt_text`: one trailing newline dropped). Files over
    4 Mi characters are tokenized in pieces cut at line breaks (the only
    difference from one call, and only at those cuts). For a single small
    file the result, saved, is byte for byte what lookup-create writes.
    """
    files = [Path(f) for f in files]
    total = 0
    for f in files:
        total += os.path.getsize(f)
    done = 0
    cache = NgramCache()
    n_tokens = 0
    for f in files:
        if cancel is not None and cancel():
            raise BuildCancelled()
        text = read_prompt_text(f)
        carry: list[int] = []
        first = True
        fsize = os.path.getsize(f)
        n_chars = max(1, len(text))
        consumed = 0
        for piece in _chunks(text):
            if cancel is not None and cancel():
                raise BuildCancelled()
            toks = model.tokenize(piece, add_special=first, parse_special=True)
            first = False
            n_tokens += len(toks)
            seq = carry + toks
            if toks:
                cache.update(seq, NGRAM_STATIC, NGRAM_STATIC, len(toks))
            carry = seq[-NGRAM_STATIC:]
            consumed += len(piece)
            if progress is not None:
                progress(done + fsize * consumed // n_chars, total, f.name)
        done += fsize
        if progress is not None:
            progress(done, total, f.name)
    return cache, n_tokens
