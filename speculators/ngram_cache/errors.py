"""What goes wrong with a lookup-cache file: not a cache at all, damaged, built for another
vocabulary, refused unread, or (for a cache the user configured) unreadable. Imports nothing."""

from __future__ import annotations


class CorruptCacheError(ValueError):
    """A lookup-cache file (or byte string) is not a valid cache."""


class NotALookupCacheError(CorruptCacheError):
    """The file is plainly not a lookup cache (text, a GGUF model, a size no cache can have),
    as told from its size and first bytes before it is read whole."""


class VocabMismatchError(CorruptCacheError):
    """A valid cache holding token ids outside the model's vocabulary: built for another model
    (or damaged). Such ids must never reach llama.cpp, which aborts on them.

    ``n_bad`` entries (n-gram, token) hold such an id; ``n_vocab`` is the vocabulary's size.
    """

    def __init__(self, message: str, n_bad: int, n_vocab: int):
        super().__init__(message)
        self.n_bad = n_bad
        self.n_vocab = n_vocab


class LookupFileRefused(CorruptCacheError):
    """A lookup file that is not read at all: not a regular file (a folder, a device, a pipe),
    or too big to load on this machine (:func:`load_limit`).

    Nothing is known about its contents, so it is never "damaged": whoever moves damaged
    caches aside must catch this one first and leave the file where it is.
    """


class LookupCacheError(ValueError):
    """An explicitly configured lookup cache cannot be read.

    ``path`` is the file, ``kind`` ``"static"`` or ``"dynamic"``; the
    original exception is chained as ``__cause__``.
    """

    def __init__(self, path: str, kind: str, reason: str):
        super().__init__(f"failed to read {kind} lookup cache {path!r}: {reason}")
        self.path = path
        self.kind = kind
        self.reason = reason

