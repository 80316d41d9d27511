"""Lookup caches that learn: draftlight's persistent static and dynamic n-gram caches.

The ``ngram-cache`` speculator drafts from three caches (see
:mod:`speculators.ngram_cache`): the current context, a *dynamic* cache of
what earlier replies contained and a *static* cache built from a text
corpus. llama.cpp's server only reads the last two; this module keeps them
on disk and lets the dynamic one grow with use.

Where
    ``paths.lookup_dir() / <fingerprint[:16]> /`` with ``static.bin`` and
    ``dynamic.bin`` (llama.cpp's lookup file format), ``meta.json`` (the
    fingerprint and the models seen with it, for ``draftlight lookup info``)
    and ``.lock``. The fingerprint is a SHA-256 of the model's vocabulary
    (every token's text, the vocabulary type and size), so models sharing a
    tokenizer share caches and different tokenizers never mix. Computing it
    reads all token texts (~0.3 s for 262k tokens); it is remembered per
    model file (path, size, mtime) in ``lookup_dir()/fingerprints.json``.
    Explicit ``--lookup-cache-static`` / ``--lookup-cache-dynamic`` paths
    replace the folder's files, as in llama.cpp.

When
    :meth:`LookupStore.for_model` (or :meth:`LookupStore.load`) reads both
    files. A missing file is an empty cache (a missing *explicit* static
    file is an error, as in llama.cpp). A file is read whole only once its
    size and first bytes show it can be a cache of a size this machine can
    load (a text corpus, a GGUF model or a multi-GB file costs one 4 KiB
    read), and with a model its token ids must all lie in the vocabulary
    (an id outside it would abort llama.cpp when drafted). A malformed file
    is never used half-way:

    * an *explicit* file (``--lookup-cache-static`` / ``--lookup-cache-dynamic``
      or the config's paths: the person's own file) is never renamed, moved,
      changed or deleted; :class:`LookupCacheError` says what is wrong with it;
    * the folder's own damaged file is moved aside to ``<name>.corrupt``
      (``.corrupt.1``, ... if taken; never deleted), a warning is returned and
      kept in :attr:`LookupStore.warnings`, and drafting goes on with an empty
      cache. One that is only too big to load here is kept in place (and a
      save refuses to write over it).

    After each reply the application calls :meth:`LookupStore.learn` with
    the conversation's tokens (prompt + reply) and then :meth:`LookupStore.save`
    (safe to call from a worker thread; :meth:`save_async` starts one).

What is learned after a reply
    llama.cpp's lookup example merges its context cache into the dynamic
    cache at exit: the n-grams (sizes ``NGRAM_MIN..NGRAM_MAX``) of prompt +
    reply. draftlight does not read the speculator's context cache for this:
    that cache never resets between replies (reference behaviour) and is
    updated per drafting stretch, so merging it after every reply would add
    earlier replies again and again. Instead :meth:`learn` counts the
    n-grams of the token sequence itself, but only those *ending after the
    longest prefix already learned* (compared with the last few sequences
    learned in this process). The first reply of a conversation therefore
    adds exactly what ``llama-lookup`` would add (the whole prompt + reply);
    later turns of the same chat add only the new user message and reply; a
    regenerated reply adds only the new reply. Each token position of a
    conversation is counted once.

    Learned n-grams go at once into :attr:`dynamic` (the object the
    speculator drafts from, so later replies of this session benefit) and
    into a *delta* cache of what this process added since it last saved.

Saving, and two processes
    :meth:`save` takes an exclusive lock on ``.lock`` (``fcntl.flock``;
    ``msvcrt.locking`` on Windows; a lock directory elsewhere). If the file
    on disk is still the one this process last read or wrote (same inode,
    size and mtime), the in-memory dynamic cache *is* disk + delta and is
    written as is; otherwise the file is read again, the delta is merged
    into what the other process wrote, and that is written (and becomes the
    in-memory cache, plus anything learned meanwhile). Writes are atomic
    (temp file in the folder, fsync, rename): a process killed while saving
    leaves the old file or the new one. Temp files left by killed writers
    are removed when older than an hour.

Size cap
    When the dynamic cache would exceed ``max_bytes`` (default
    :data:`DEFAULT_MAX_BYTES`, 32 MiB: about a million entries; the file is
    parsed in Python, ~0.25 s per MiB) it is pruned to 90 % of the cap by
    dropping the entries (n-gram, next token) with the lowest counts first;
    among equal counts the oldest (first seen earliest) go first.

For the application's settings pane
    :meth:`LookupStore.info` (sizes, entry counts),
    :meth:`LookupStore.contribution` (drafted/accepted per cache, from the
    running speculator), :meth:`LookupStore.build_static` (from files,
    with progress and cancel) and :meth:`LookupStore.clear_dynamic`.

The package, one job per module
    :mod:`~app.lookup_store.store` (:class:`LookupStore`, :class:`Learner`: load,
    learn, merge, prune, save), :mod:`~app.lookup_store.lock` (:class:`FileLock`),
    :mod:`~app.lookup_store.layout` (file names, ``meta.json``),
    :mod:`~app.lookup_store.fingerprint` (which folder a tokenizer's caches live in),
    :mod:`~app.lookup_store.vocab` (a GGUF's vocabulary without its weights),
    :mod:`~app.lookup_store.corpus` (static caches from text files, as lookup-create),
    :mod:`~app.lookup_store.simulate` (``lookup stats``), :mod:`~app.lookup_store.folders`
    (``lookup info`` / ``clear``), :mod:`~app.lookup_store.results` (what they return) and
    :mod:`~app.lookup_store.errors`. This file only re-exports their names.
"""

from __future__ import annotations

from .corpus import build_static_cache, process_escapes, read_prompt_text
from .errors import BuildCancelled, LockTimeout, LookupStoreError
from .fingerprint import _FP_MEMO, compute_fingerprint, folder_for_fingerprint, tokenizer_fingerprint
from .folders import list_folders, remove_folder, scan_file
from .layout import DYNAMIC_NAME, FINGERPRINTS_NAME, LOCK_NAME, META_NAME, STATIC_NAME, read_meta
from .lock import FileLock
from .results import BuildResult, CacheInfo, FolderInfo, SaveResult
from .simulate import SimStats, simulate_drafting
from .store import (
    DEFAULT_MAX_BYTES, PRUNE_TO, Learner, LookupStore, _reason, learn_tokens, move_aside, prune_cache,
)
from .vocab import open_vocab, vocab_model_class

__all__ = [
    "DEFAULT_MAX_BYTES", "PRUNE_TO", "STATIC_NAME", "DYNAMIC_NAME", "META_NAME", "LOCK_NAME",
    "LookupStore", "LookupStoreError", "LockTimeout", "BuildCancelled", "FileLock",
    "CacheInfo", "FolderInfo", "SaveResult", "BuildResult", "SimStats",
    "tokenizer_fingerprint", "compute_fingerprint", "folder_for_fingerprint", "open_vocab", "read_meta",
    "prune_cache", "move_aside", "scan_file", "list_folders", "remove_folder",
    "build_static_cache", "simulate_drafting", "learn_tokens", "Learner",
    "process_escapes", "read_prompt_text", "FINGERPRINTS_NAME",
    # private, imported by the tests: the fingerprint memo, an error's message less its path
    "_FP_MEMO", "_reason",
]


def __getattr__(name: str):  # VocabModel, created lazily (imports llama_cpp)
    if name == "VocabModel":
        return vocab_model_class()
    raise AttributeError(name)
