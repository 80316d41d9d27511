"""The errors the llama.cpp layer raises: a model that cannot be used, a decode that failed,
ran out of context or was stopped. Imports nothing of draftlight's."""

from __future__ import annotations


class ModelError(RuntimeError):
    """A model file cannot be used; the message says why, in one line."""


class DecodeError(RuntimeError):
    """llama.cpp could not decode a batch, or restore a checkpoint; the message says why."""


class ContextFull(RuntimeError):
    """A decode would go past the context's last position, or found no memory slot for its batch."""


class DecodeAborted(DecodeError):
    """A decode stopped by :meth:`Context.request_abort` (llama.cpp's abort callback).

    llama.cpp drops the aborted batch's positions from the memory; ``n_done`` tokens of
    the call (whole ``n_batch`` chunks decoded before it) are in the context."""

    def __init__(self, n_done: int = 0):
        super().__init__("the decode was stopped")
        self.n_done = n_done

