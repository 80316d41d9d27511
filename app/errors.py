"""One base class for the errors a person is shown, and the one way to word any error.

Errors raised by the engine (``speculators/``) and by the app's own modules
that describe a problem with the person's input or files (a missing model,
a damaged cache, a prompt that does not fit, ...) are *user errors*: their
message is already a sentence meant for people, so it is shown as it is.
Anything else is a bug or an unexpected failure: it is shown with its type,
so that a bug report says what went wrong.

``speculators/`` must not import the app, so its error classes are
counted as subclasses of :class:`UserError` here, by the one list of them
(:func:`user_error_types`)::

    >>> from speculators.engine import GenerationError
    >>> isinstance(GenerationError("the prompt is empty"), UserError)
    True
    >>> describe(GenerationError("the prompt is empty"))
    'the prompt is empty'
    >>> describe(KeyError("x"))
    "'x' (KeyError)"

An ``except`` clause does not see those virtual subclasses: catch
:func:`user_errors` (``except user_errors() as e``) where an engine error
must be caught too; the commands catch :func:`expected_errors`.
"""

from __future__ import annotations

import abc
import functools


class UserError(Exception, metaclass=abc.ABCMeta):
    """An error whose message is meant for the person using draftlight."""

    @classmethod
    def __subclasshook__(cls, sub: type) -> bool:
        if cls is UserError and issubclass(sub, user_error_types()):
            return True
        return NotImplemented


@functools.lru_cache(maxsize=1)
def user_error_types() -> tuple[type, ...]:
    """The error classes outside :class:`UserError`'s own subclasses whose message is meant for
    people: the engine's, and the app's that cannot derive from it (the one list of them)."""
    # imported on first use: the engine's modules load llama.cpp
    from speculators.chain import Unavailable
    from speculators.compat import IncompatibleDraftModel, VocabUnreadable
    from speculators.devices import DeviceError
    from speculators.engine import GenerationError
    from speculators.ext import MissingSymbolError
    from speculators.gguf_detect import GGUFError
    from speculators.llama import ContextFull, DecodeError, ModelError
    from speculators.ngram_cache import CorruptCacheError, LookupCacheError
    from speculators.params import ParamError
    from speculators.template import ChatTemplateError
    from speculators.types import UnknownSpecType

    from .config import ConfigError
    from .lookup_store import LookupStoreError
    from .models import DefaultModelError
    from .storage import HistoryError

    return (Unavailable, IncompatibleDraftModel, VocabUnreadable, GenerationError, MissingSymbolError,
            GGUFError, ContextFull, DecodeError, ModelError, CorruptCacheError, LookupCacheError,
            ParamError, ChatTemplateError, UnknownSpecType, ConfigError, LookupStoreError,
            DefaultModelError, HistoryError, DeviceError)


#: the operating system's errors about a file the person named (``describe`` words them)
FILE_ERRORS: tuple[type[OSError], ...] = (FileNotFoundError, IsADirectoryError, PermissionError)


def user_errors() -> tuple[type[BaseException], ...]:
    """For an ``except`` clause: :class:`UserError` (its subclasses) and the classes counted as one."""
    return (UserError,) + user_error_types()


def expected_errors() -> tuple[type[BaseException], ...]:
    """What a command reports as one line, never a traceback: the user errors and the file errors."""
    return user_errors() + FILE_ERRORS


def describe(e: BaseException) -> str:
    """One clear line for an error, never a traceback."""
    msg = str(e).strip()
    if isinstance(e, FileNotFoundError) and getattr(e, "filename", None):
        return f"file not found: {e.filename}"
    if isinstance(e, PermissionError) and getattr(e, "filename", None):
        return f"permission denied: {e.filename}"
    if not msg:
        return e.__class__.__name__
    if isinstance(e, UserError):
        return msg
    return f"{msg} ({e.__class__.__name__})"
