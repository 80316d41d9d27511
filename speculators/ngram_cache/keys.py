"""What an n-gram is in llama.cpp's lookup caches: up to four token ids padded with -1 to a
4-tuple key, the n-gram sizes the caches use, and the C integer ranges their ids and counts
live in. Pure data; imports nothing."""

from __future__ import annotations

from typing import Iterable

#: ``LLAMA_TOKEN_NULL``: the padding of n-grams shorter than four tokens.
LLAMA_TOKEN_NULL = -1
#: ``LLAMA_NGRAM_MIN`` / ``LLAMA_NGRAM_MAX``: n-gram sizes of the context
#: and dynamic caches. ``LLAMA_NGRAM_MAX`` is also the stored n-gram width.
NGRAM_MIN = 1
NGRAM_MAX = 4
#: ``LLAMA_NGRAM_STATIC``: the n-gram size of static caches.
NGRAM_STATIC = 2

Ngram = tuple  # four ints, padded with LLAMA_TOKEN_NULL

#: C ``int`` (token ids, counts) and ``uint32_t`` / ``size_t`` ranges, for llama.cpp's arithmetic
_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
_U32 = (1 << 32) - 1
_U64 = (1 << 64) - 1
#: ``_PAD[n]``: the padding that makes an n-gram of ``n`` tokens a stored key
_PAD = tuple((LLAMA_TOKEN_NULL,) * (NGRAM_MAX - n) for n in range(NGRAM_MAX + 1))


def ngram_key(tokens: Iterable[int]) -> Ngram:
    """The stored form of an n-gram: the first four tokens, padded with -1.

    >>> ngram_key([7, 8])
    (7, 8, -1, -1)
    """
    t = tuple(int(x) for x in tokens)[:NGRAM_MAX]
    return t + _PAD[len(t)]

