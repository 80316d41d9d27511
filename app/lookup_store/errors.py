"""The lookup store's exceptions.

Holds only exception classes; imports nothing (every other module of
:mod:`app.lookup_store` may import it).
"""


class LookupStoreError(Exception):
    """A lookup cache could not be saved or changed (the message says why)."""


class LockTimeout(LookupStoreError):
    """Another process held the cache folder's lock for too long."""


class BuildCancelled(Exception):
    """:func:`build_static_cache` was cancelled; nothing was written."""
