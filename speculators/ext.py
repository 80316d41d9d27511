"""Bindings for the llama.cpp API the hidden-state drafters need.

llama-cpp-python binds most of ``llama.h`` (``llama_batch_ext_*``,
``llama_process``, ``llama_n_rs_seq``, ``llama_model_n_layer_nextn``) and a
few functions of the staging header ``src/llama-ext.h`` (NextN embeddings,
``llama_get_ctx_other``). The reference's speculators also call the rest of
``llama-ext.h``: layer-input embeddings (EAGLE3 / DFlash feature taps), the
drafter's target layer ids, the DFlash selector top-k and the token
embedding matrix. This module looks all of them up in the *same* shared
library llama-cpp-python loaded (``llama_cpp.llama_cpp._lib``).

``llama-ext.h`` has no ``extern "C"``: its functions are exported under
their C++ (mangled) names, which differ between compilers. Each function
below lists the plain name, the Itanium (GCC/Clang: Linux, macOS) name and,
where known, the MSVC name; the first one the library exports is used.

>>> require("llama_model_target_layer_ids_n").__name__ in available() or True
True
>>> try:
...     require("llama_no_such_function")
... except MissingSymbolError as e:
...     print(str(e).split(";")[0])
this llama.cpp build lacks llama_no_such_function
"""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import llama_cpp as lc

__all__ = ["MissingSymbolError", "require", "has", "available", "SYMBOLS", "library"]

_ctx_p = ctypes.c_void_p
_model_p = ctypes.c_void_p
_f32_p = ctypes.POINTER(ctypes.c_float)


class MissingSymbolError(RuntimeError):
    """The loaded llama.cpp shared library does not export a needed function."""

    def __init__(self, name: str, tried: tuple[str, ...] = ()):
        self.symbol = name
        self.tried = tried
        super().__init__(
            f"this llama.cpp build lacks {name}; it is needed by the hidden-state drafters "
            f"(draft-mtp, draft-eagle3, draft-dflash, draft-dspark). Install a llama-cpp-python "
            f"built from a llama.cpp that exports it"
            + (f" (looked for: {', '.join(tried)})" if tried else ""))


#: name -> (candidate exported names, argtypes, restype)
SYMBOLS: dict[str, tuple[tuple[str, ...], list[Any], Any]] = {
    # -- llama-ext.h (C++ linkage) ------------------------------------------------
    "llama_set_embeddings_nextn": (
        ("llama_set_embeddings_nextn", "_Z26llama_set_embeddings_nextnP13llama_contextbb",
         "?llama_set_embeddings_nextn@@YAXPEAUllama_context@@_N1@Z"),
        [_ctx_p, ctypes.c_bool, ctypes.c_bool], None),
    "llama_set_nextn_layer_offset": (
        ("llama_set_nextn_layer_offset", "_Z28llama_set_nextn_layer_offsetP13llama_contexti",
         "?llama_set_nextn_layer_offset@@YAXPEAUllama_context@@H@Z"),
        [_ctx_p, ctypes.c_int32], None),
    "llama_get_embeddings_nextn": (
        ("llama_get_embeddings_nextn", "_Z26llama_get_embeddings_nextnP13llama_context",
         "?llama_get_embeddings_nextn@@YAPEAMPEAUllama_context@@@Z"),
        [_ctx_p], _f32_p),
    "llama_get_embeddings_nextn_ith": (
        ("llama_get_embeddings_nextn_ith", "_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
         "?llama_get_embeddings_nextn_ith@@YAPEAMPEAUllama_context@@H@Z"),
        [_ctx_p, ctypes.c_int32], _f32_p),
    "llama_set_embeddings_layer_inp": (
        ("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
         "?llama_set_embeddings_layer_inp@@YAXPEAUllama_context@@I_N@Z"),
        [_ctx_p, ctypes.c_uint32, ctypes.c_bool], None),
    "llama_get_embeddings_layer_inp": (
        ("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
         "?llama_get_embeddings_layer_inp@@YAPEAMPEAUllama_context@@I@Z"),
        [_ctx_p, ctypes.c_uint32], _f32_p),
    "llama_get_ctx_other": (
        ("llama_get_ctx_other", "_Z19llama_get_ctx_otherP13llama_context",
         "?llama_get_ctx_other@@YAPEAUllama_context@@PEAU1@@Z"),
        [_ctx_p], _ctx_p),
    "llama_model_dflash_selector_top_k": (
        ("llama_model_dflash_selector_top_k", "_Z33llama_model_dflash_selector_top_kPK11llama_model",
         "?llama_model_dflash_selector_top_k@@YAHPEBUllama_model@@@Z"),
        [_model_p], ctypes.c_int32),
    "llama_model_target_layer_ids": (
        ("llama_model_target_layer_ids", "_Z28llama_model_target_layer_idsPK11llama_model",
         "?llama_model_target_layer_ids@@YAPEBHPEBUllama_model@@@Z"),
        [_model_p], ctypes.POINTER(ctypes.c_int32)),
    "llama_model_target_layer_ids_n": (
        ("llama_model_target_layer_ids_n", "_Z30llama_model_target_layer_ids_nPK11llama_model",
         "?llama_model_target_layer_ids_n@@YAIPEBUllama_model@@@Z"),
        [_model_p], ctypes.c_uint32),
    "llama_model_get_tok_embd": (
        ("llama_model_get_tok_embd", "_Z24llama_model_get_tok_embdPK11llama_modelPf",
         "?llama_model_get_tok_embd@@YAIPEBUllama_model@@PEAM@Z"),
        [_model_p, _f32_p], ctypes.c_uint32),
    # -- llama.h (C linkage; bound by llama-cpp-python too, checked here) --------
    "llama_model_n_layer_nextn": (("llama_model_n_layer_nextn",), [_model_p], ctypes.c_int32),
    "llama_model_n_embd_out": (("llama_model_n_embd_out",), [_model_p], ctypes.c_int32),
    "llama_model_n_embd_inp": (("llama_model_n_embd_inp",), [_model_p], ctypes.c_int32),
    "llama_n_rs_seq": (("llama_n_rs_seq",), [_ctx_p], ctypes.c_uint32),
}


def library() -> ctypes.CDLL:
    """The shared library llama-cpp-python loaded."""
    lib = getattr(getattr(lc, "llama_cpp", None), "_lib", None)
    if lib is None:  # pragma: no cover - very old llama-cpp-python
        raise MissingSymbolError("llama_cpp._lib (the llama-cpp-python library handle)")
    return lib


_cache: dict[str, Callable] = {}


def _lookup(name: str) -> Callable | None:
    fn = _cache.get(name)
    if fn is not None:
        return fn
    spec = SYMBOLS.get(name)
    cands = spec[0] if spec else (name,)
    lib = library()
    for c in cands:
        try:
            f = getattr(lib, c)
        except AttributeError:
            continue
        if spec is not None:
            f.argtypes = spec[1]
            f.restype = spec[2]
        _cache[name] = f
        return f
    return None


def has(name: str) -> bool:
    """Whether the loaded library exports ``name`` (under any of its known names)."""
    return _lookup(name) is not None


def require(name: str) -> Callable:
    """The function ``name`` of the loaded library, or :class:`MissingSymbolError`."""
    f = _lookup(name)
    if f is None:
        spec = SYMBOLS.get(name)
        raise MissingSymbolError(name, spec[0] if spec else ())
    return f


def require_all(*names: str) -> None:
    for n in names:
        require(n)


def available() -> list[str]:
    """The names of :data:`SYMBOLS` this build exports."""
    return [n for n in SYMBOLS if has(n)]


# -- convenience wrappers ---------------------------------------------------------------

def target_layer_ids(model_ptr) -> list[int]:
    """``llama_model_target_layer_ids`` of a drafter model, as a list."""
    n = int(require("llama_model_target_layer_ids_n")(model_ptr))
    if n == 0:
        return []
    p = require("llama_model_target_layer_ids")(model_ptr)
    return [int(p[i]) for i in range(n)] if p else []
