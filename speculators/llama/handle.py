"""A native llama.cpp object held by a Python one: freed by ``close()``, and at the latest when
the Python object is collected. Touches nothing but the object's own ``close``."""

from __future__ import annotations

import contextlib


class NativeHandle:
    """Base of :class:`~.model.Model` and :class:`~.context.Context`: ``close()`` frees the native
    object (and may be called twice); collecting the Python object calls it, errors ignored."""

    def close(self) -> None:  # pragma: no cover - every subclass frees its own object
        raise NotImplementedError

    def __del__(self):  # pragma: no cover
        with contextlib.suppress(Exception):
            self.close()
