"""Stopping a decode in progress: a flag llama.cpp's abort callback reads with no Python in
the loop. Touches only ctypes and llama-cpp-python's callback type."""

from __future__ import annotations

import contextlib
import ctypes

import llama_cpp as lc


class AbortFlag:
    """A flag that llama.cpp's abort callback reads between the nodes of a graph, with no
    Python in the loop: the callback is libc's ``strlen`` over two bytes ``[flag, 0]``, so
    it returns 1 (abort) once the flag byte is set and 0 otherwise. ggml's CPU backend asks
    it after every node; a Python callback there would cost a lock and a call per node.
    Backends that do not take an abort callback (CUDA, Metal) finish their batch first.

    >>> f = AbortFlag()
    >>> f.is_set(), f.set(), f.is_set(), f.clear(), f.is_set()
    (False, None, True, None, False)
    >>> AbortFlag.callback() is None or bool(AbortFlag.callback())
    True
    """

    _callback: object = None
    _looked = False

    def __init__(self) -> None:
        self._buf = ctypes.create_string_buffer(2)

    @classmethod
    def callback(cls):
        """libc's ``strlen`` as a ``ggml_abort_callback`` (None where libc cannot be found)."""
        if not cls._looked:
            cls._looked = True
            with contextlib.suppress(Exception):
                import ctypes.util
                libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
                addr = ctypes.cast(libc.strlen, ctypes.c_void_p).value
                if addr:
                    cls._callback = lc.ggml_abort_callback(addr)
        return cls._callback

    @property
    def address(self) -> int:
        return ctypes.addressof(self._buf)

    def set(self) -> None:
        self._buf[0] = b"\x01"

    def clear(self) -> None:
        self._buf[0] = b"\x00"

    def is_set(self) -> bool:
        return self._buf[0] != b"\x00"

