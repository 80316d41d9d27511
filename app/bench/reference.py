"""``bench``'s reference row: llama-cpp-python's own greedy generation of the same prompts, with
the engine's threads, batch and weight placement, ending where the engine's generation ends."""

from __future__ import annotations

import contextlib
import time
from typing import Sequence

#: the reference row's name in the report
REFERENCE = "llama-cpp-python"


def open_reference(engine, model_path: str, ecfg):
    """llama-cpp-python's ``Llama`` for ``model_path``, loaded as ``engine``'s model is: the same
    context size, threads (llama-cpp-python's default is half the cores), batch, offloaded layers
    and use of the CPU's extra buffer types."""
    from llama_cpp import Llama
    threads = engine.ctx.n_threads
    with placed_like(engine.model):
        return Llama(model_path=model_path, n_ctx=ecfg.n_ctx, n_threads=threads, n_threads_batch=threads,
                     n_gpu_layers=ecfg.n_gpu_layers, n_batch=ecfg.n_batch, verbose=False)


@contextlib.contextmanager
def placed_like(model):
    """While llama-cpp-python's ``Llama`` loads a model, its model parameters use the CPU's extra
    buffer types as ``model`` (the engine's) does. ``Llama`` has no argument for them and leaves
    llama.cpp's default (all of them), which on a CPU whose AMX kernels crash kills the process at
    its first matrix multiply, and elsewhere would time other kernels than the engine's."""
    import llama_cpp.llama_cpp as raw
    from speculators.llama import place_on_cpu
    default_params, keep = raw.llama_model_default_params, []

    def params():
        p = default_params()
        keep.append(place_on_cpu(p, model.path, model.extra_bufts_mode, model.n_gpu_layers, model.devices))
        return p

    raw.llama_model_default_params = params
    try:
        yield
    finally:
        raw.llama_model_default_params = default_params
        keep.clear()


def llama_cpp_python_once(llm, prompt: list[int], max_tokens: int,
                          stop: Sequence[str] = ()) -> tuple[float, list[int], int]:
    """llama-cpp-python's own greedy generation, ending where the engine's does (an end-of-
    generation token, a stop string, ``max_tokens``); (seconds after the first token, the
    reply's tokens, the tokens generated: as the engine, those of a stop string count)."""
    llm.reset()
    out: list[int] = []
    t_first = None
    text = b""
    stops = [x.encode() for x in stop]
    longest = max((len(x) for x in stops), default=0)
    for tok in llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        if t_first is None:
            t_first = time.perf_counter()
        if llm._model.token_is_eog(tok) if hasattr(llm._model, "token_is_eog") else tok == llm.token_eos():
            break
        out.append(tok)
        if stop:
            piece = llm.detokenize([tok])
            text += piece
            start = max(0, len(text) - len(piece) - longest)   # only where this token can end one
            hits = [i for i in (text.find(x, start) for x in stops) if i >= 0]
            if hits:
                # as the engine: the reply ends before the stop string; tokens from there go
                t_end, n_generated = time.perf_counter(), len(out)
                while out and len(llm.detokenize(out[:-1])) >= min(hits):
                    out.pop()
                return t_end - t_first, out, n_generated
        if len(out) >= max_tokens:
            break
    return (time.perf_counter() - t_first if t_first is not None else 0.0), out, len(out)
