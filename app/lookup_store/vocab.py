"""A GGUF model loaded for its vocabulary only (tokenize, token texts, no weights).

Holds :func:`open_vocab` and the lazily built ``VocabModel`` class (it imports
``llama_cpp`` on first use). Reads the GGUF file; writes nothing.
"""

from __future__ import annotations

import os

def _vocab_model_class():
    from speculators.llama import Model, ModelError, VocabInfo, _last_errors, backend_init, check_gguf_file
    import llama_cpp as lc

    class VocabModel(Model):
        """A GGUF loaded with ``vocab_only``: tokenize, token texts, no weights."""

        def __init__(self, path: str | os.PathLike):  # noqa: D401 - no super().__init__: no weights
            backend_init()
            self.path = os.fspath(path)
            check_gguf_file(self.path)
            params = lc.llama_model_default_params()
            params.vocab_only = True
            params.n_gpu_layers = 0
            ptr = lc.llama_model_load_from_file(self.path.encode(), params)
            if not ptr:
                why = _last_errors()
                raise ModelError(f"cannot load the vocabulary of {self.path}" + (f": {why}" if why else ""))
            self.ptr = ptr
            self.vocab = v = lc.llama_model_get_vocab(ptr)
            self.info = VocabInfo(
                n_vocab=lc.llama_vocab_n_tokens(v), bos=lc.llama_vocab_bos(v), eos=lc.llama_vocab_eos(v),
                eot=lc.llama_vocab_eot(v), add_bos=bool(lc.llama_vocab_get_add_bos(v)),
                add_eos=bool(lc.llama_vocab_get_add_eos(v)), vocab_type=int(lc.llama_vocab_type(v)))
            self.n_vocab = self.info.n_vocab
            self.is_recurrent = self.is_hybrid = False
            self.load_mtp = False
            self._piece_cache = {}
            self._eog_known = {}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

    return VocabModel


_VOCAB_CLS = None


def open_vocab(path: str | os.PathLike):
    """Load only the vocabulary of a GGUF model (fast; no weights).

    The object has ``tokenize``, ``token_text``, ``n_vocab``, ``info``,
    ``path`` and ``close`` like :class:`speculators.llama.Model`, and is a
    context manager.
    """
    return vocab_model_class()(path)


def vocab_model_class():
    """The ``VocabModel`` class (built on first use)."""
    global _VOCAB_CLS
    if _VOCAB_CLS is None:
        _VOCAB_CLS = _vocab_model_class()
    return _VOCAB_CLS
