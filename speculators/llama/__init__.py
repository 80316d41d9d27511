"""A thin, safe layer over llama-cpp-python's low-level API.

Only what the generation loop needs: load a model (with a clear error for
a missing, truncated or non-GGUF file), tokenize, turn tokens into bytes,
one context with a reusable batch, logits as numpy views, and the KV-cache
operations (remove a tail, save/restore a sequence checkpoint).

One job per module, each importing only those listed before it:

* :mod:`.errors`: what this layer raises;
* :mod:`.abort`: the flag that stops a decode in progress;
* :mod:`.log`: llama.cpp's log (kept quiet, last lines remembered) and the backend's initialisation;
* :mod:`.gguf_check`: refusing a model file that is missing, not GGUF, damaged or cut short;
* :mod:`.placement`: the CPU's extra buffer types and the offload devices of a load;
* :mod:`.threads`: the default thread count (the physical cores);
* :mod:`.handle`: a native object freed by ``close()`` or when collected;
* :mod:`.model`: a loaded model, its vocabulary and tokenizer;
* :mod:`.context`: a context: decoding, logits, memory and checkpoints.

Every name is importable from ``speculators.llama``; nothing here imports the app.
"""

from __future__ import annotations

from .abort import AbortFlag
from .context import Context
from .errors import ContextFull, DecodeAborted, DecodeError, ModelError
from .gguf_check import GGUF_MAGIC, check_gguf_file
from .log import _last_errors, backend_init
from .model import Model, VocabInfo
from .placement import (
    EXTRA_BUFT_MODES, extra_bufts, extra_bufts_mode, llama_server_mode, place_on_cpu, set_extra_bufts,
)
from .threads import physical_cores

__all__ = [
    "AbortFlag", "Context", "ContextFull", "DecodeAborted", "DecodeError", "ModelError",
    "GGUF_MAGIC", "check_gguf_file", "_last_errors", "backend_init", "Model", "VocabInfo",
    "EXTRA_BUFT_MODES", "extra_bufts", "extra_bufts_mode", "llama_server_mode", "place_on_cpu",
    "set_extra_bufts", "physical_cores",
]
