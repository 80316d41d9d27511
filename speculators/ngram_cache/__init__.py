"""The ``ngram-cache`` speculator and llama.cpp's lookup-cache files.

This mirrors three pieces of llama.cpp:

* ``common/ngram-cache.{h,cpp}``: the n-gram cache (an n-gram of up to
  four tokens, padded with -1, mapped to the counts of the tokens seen
  after it), its update, merge, save and load, and the drafting rule
  ``common_ngram_cache_draft`` with its lax/strict thresholds;
* ``common_speculative_impl_ngram_cache`` of ``common/speculative.cpp``:
  a context cache grown from the conversation, plus an optional *dynamic*
  cache (earlier generations) and *static* cache (a text corpus, built by
  ``llama-lookup-create``), drafting at most 8 tokens;
* the lookup-cache file format, read and written byte for byte.

A worked example. In ``1 2 3 1 2 3 1`` the 4-gram ``(1, 2, 3, 1)`` was
followed by ``2`` once, which is enough for a 4-gram under the lax
(context) thresholds; then ``(2, 3, 1, 2)`` gives ``3``, and so on:

>>> ctx = NgramCache()
>>> inp = [1, 2, 3, 1, 2, 3, 1]
>>> ctx.update(inp, NGRAM_MIN, NGRAM_MAX, len(inp))
>>> ctx[(2, 3, 1)]
{2: 1}
>>> ngram_cache_draft(inp, [inp[-1]], 3, NGRAM_MIN, NGRAM_MAX, ctx, NgramCache(), NgramCache())
[1, 2, 3, 1]

The draft list starts with the last sampled token (as in llama.cpp) and
grows by the drafted tokens: ``2 3 1``.

Tie-breaking. llama.cpp keeps counts in ``std::unordered_map`` and, when
two candidates score the same, the one met first while iterating wins; it
also saves entries in iteration order. The C++ standard leaves that order
unspecified; this module reproduces the order of GNU libstdc++ (what
llama.cpp gets when built with GCC, checked against GCC 12), computed
from the order in which keys were first inserted. See :func:`stl_order`.

One job per module, each importing (at run time) only those listed before it:

* :mod:`.keys`: what an n-gram key is (sizes, padding, C integer ranges);
* :mod:`.errors`: what goes wrong with a lookup file;
* :mod:`.stl_order`: libstdc++'s ``unordered_map`` iteration order;
* :mod:`.file_format`: the file's records, byte for byte, and the atomic write;
* :mod:`.file_checks`: which files are read at all, and the vocabulary check;
* :mod:`.table`: :class:`NgramCache`, the n-gram statistics table;
* :mod:`.draft`: the drafting rule, :func:`ngram_cache_draft`;
* :mod:`.speculator`: :class:`NgramCacheSpeculator`, its declaration and factory.

Every name below is importable from ``speculators.ngram_cache``; nothing here imports the app.
"""

from __future__ import annotations

from .draft import (
    DRAFT_MIN_PERCENT_LAX, DRAFT_MIN_PERCENT_STRICT, DRAFT_MIN_SAMPLE_SIZE_LAX, DRAFT_MIN_SAMPLE_SIZE_STRICT,
    SOURCE_CONTEXT, SOURCE_DYNAMIC, SOURCE_NAMES, SOURCE_STATIC, ngram_cache_draft,
)
from .errors import (
    CorruptCacheError, LookupCacheError, LookupFileRefused, NotALookupCacheError, VocabMismatchError,
)
from .file_checks import (
    GGUF_MAGIC, LOAD_MEMORY_FACTOR, MAX_FILE_BYTES, check_lookup_head, check_vocab, load_limit,
    read_lookup_file, vocab_violations,
)
from .file_format import atomic_write
from .keys import LLAMA_TOKEN_NULL, NGRAM_MAX, NGRAM_MIN, NGRAM_STATIC, Ngram, ngram_key
from .speculator import N_DRAFT, NgramCacheSpeculator, load_lookup_cache
from .stl_order import stl_order
from .table import NgramCache

__all__ = [
    "CorruptCacheError", "NotALookupCacheError", "VocabMismatchError", "LookupFileRefused",
    "LookupCacheError", "NgramCache", "NgramCacheSpeculator",
    "LLAMA_TOKEN_NULL", "NGRAM_MIN", "NGRAM_MAX", "NGRAM_STATIC", "N_DRAFT",
    "DRAFT_MIN_SAMPLE_SIZE_LAX", "DRAFT_MIN_PERCENT_LAX",
    "DRAFT_MIN_SAMPLE_SIZE_STRICT", "DRAFT_MIN_PERCENT_STRICT",
    "ngram_cache_draft", "ngram_key", "stl_order", "load_lookup_cache", "SOURCE_NAMES",
    "MAX_FILE_BYTES", "LOAD_MEMORY_FACTOR", "load_limit", "check_lookup_head", "read_lookup_file",
    "vocab_violations", "check_vocab",
    "SOURCE_CONTEXT", "SOURCE_DYNAMIC", "SOURCE_STATIC", "GGUF_MAGIC", "Ngram", "atomic_write",
]
