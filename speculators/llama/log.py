"""llama.cpp's log: kept quiet, but its last lines remembered (a failed load is explained from
them), optionally echoed to stderr (``DRAFTLIGHT_LLAMA_LOG``) or to a file descriptor a parent
process reads (``DRAFTLIGHT_LOG_FD``); and the one-time backend initialisation that installs it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

import llama_cpp as lc

_log_lock = threading.Lock()
_recent_log: list[str] = []
_verbose = bool(os.environ.get("DRAFTLIGHT_LLAMA_LOG"))
#: a file descriptor that every line llama.cpp logs is also written to (a runner's parent reads
#: it, so that the last lines before a crash of native code can be shown)
_log_fd: int | None = None
with contextlib.suppress(ValueError):
    _log_fd = int(os.environ["DRAFTLIGHT_LOG_FD"]) if os.environ.get("DRAFTLIGHT_LOG_FD") else None
_backend_ready = False
_last_level = 0


@lc.llama_log_callback
def _log_cb(level, text, _user):  # pragma: no cover - called from C
    try:
        msg = text.decode("utf-8", "replace") if text else ""
    except Exception:
        return
    if _verbose:
        import sys
        sys.stderr.write(msg)
    global _last_level
    if level != 5:   # GGML_LOG_LEVEL_CONT continues the line before
        _last_level = level
    if _log_fd is not None and _last_level != 1:   # not GGML_LOG_LEVEL_DEBUG
        with contextlib.suppress(OSError):
            os.write(_log_fd, msg.encode("utf-8", "replace"))
    # keep the last lines: a failed load is explained from them (see _last_errors)
    with _log_lock:
        _recent_log.append(msg)
        del _recent_log[:-40]


def backend_init() -> None:
    """Install the log callback and initialise llama.cpp's backends, once per process."""
    global _backend_ready
    if not _backend_ready:
        lc.llama_log_set(_log_cb, ctypes.c_void_p(0))
        lc.llama_backend_init()
        _backend_ready = True


def _last_errors() -> str:
    """The most telling line llama.cpp logged during the last failed call."""
    with _log_lock:
        lines = [l.strip() for l in _recent_log if l.strip()]
    for line in reversed(lines):
        low = line.lower()
        if "error loading model:" in low:
            return line[low.index("error loading model:") + len("error loading model:"):].strip()
    errs = [l for l in lines if ("error" in l.lower() or "invalid" in l.lower())
            and "failed to load model" not in l]
    return (errs or lines or [""])[-1]


def clear_recent_log() -> None:
    """Forget the remembered lines (before a call whose failure :func:`_last_errors` explains)."""
    with _log_lock:
        _recent_log.clear()
