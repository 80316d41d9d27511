"""Can a draft model speculate for a target? llama.cpp's vocabulary check.

``common_speculative_are_compatible`` in the reference accepts a draft
model only when, in this order:

1. the vocab types are the same (SPM, BPE, ...);
2. both add a BOS token or neither does, and when they do, with the same id;
3. the same for EOS;
4. the vocab sizes differ by at most 128 tokens;
5. every token text from id 5 up to the smaller vocab size is identical.

:func:`check_compatible` applies it to two loaded models and raises
:class:`IncompatibleDraftModel` naming the first rule that fails.
:func:`vocab_of_gguf` builds the same inputs from a file's metadata alone
(mirroring how llama.cpp's vocabulary loader derives them, defaults
included), so :func:`compatibility` can judge files on disk without
loading any weights and reach the same verdict with the same message.

A worked example with two hand-made vocabularies:

>>> t = VocabSummary(vocab_type=1, add_bos=True, bos=2, add_eos=False, eos=1, n_tokens=8,
...                  texts=[b"<pad>", b"<eos>", b"<bos>", b"<unk>", b"<m>", b"a", b"b", b"c"])
>>> d = VocabSummary(vocab_type=1, add_bos=True, bos=2, add_eos=False, eos=1, n_tokens=8,
...                  texts=[b"?", b"?", b"?", b"?", b"?", b"a", b"B", b"c"])
>>> compare_vocabs(t, d)
Traceback (most recent call last):
...
speculators.compat.IncompatibleDraftModel: draft.model: incompatible with the target model: token text at id 6 differs: 'b' vs 'B'
>>> d.texts[6] = b"b"; compare_vocabs(t, d)   # ids 0-4 are not compared
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Union

from .params import ParamError

__all__ = ["Compatibility", "IncompatibleDraftModel", "VocabSummary", "check_compatible", "compare_vocabs",
           "compatibility", "vocab_of_gguf", "vocab_of_model", "VOCAB_MAX_SIZE_DIFFERENCE",
           "VOCAB_CHECK_START_TOKEN_ID"]

VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5

#: ``enum llama_vocab_type``
VOCAB_TYPE_NAMES = {0: "none", 1: "SPM", 2: "BPE", 3: "WPM", 4: "UGM", 5: "RWKV", 6: "PLaMo-2", 7: "test"}

#: the rules, in the order they are checked
RULES = ("vocab_type", "bos", "eos", "vocab_size", "token_text")


class IncompatibleDraftModel(ParamError):
    """The draft model cannot draft for the target; ``rule`` says which check failed.

    A :class:`~speculators.params.ParamError` on ``draft.model`` (so the CLI
    prints it as one line and the settings pane can mark the field), and
    so a ``ValueError``. ``reason`` is the message without the prefix.
    """

    def __init__(self, rule: str, reason: str):
        super().__init__("draft.model", f"incompatible with the target model: {reason}")
        self.rule = rule
        self.reason = reason


@dataclass
class VocabSummary:
    """What the check reads of a vocabulary.

    ``texts`` are token texts as ``llama_vocab_get_text`` returns them
    (bytes up to the first NUL); either a list or a function that returns
    one (called at most once, and only when rules 1-4 pass).
    """

    vocab_type: int
    add_bos: bool
    bos: int
    add_eos: bool
    eos: int
    n_tokens: int
    texts: Union[list, Callable[[], list]] = field(default_factory=list, repr=False)

    def text_list(self) -> list[bytes]:
        if callable(self.texts):
            self.texts = self.texts()
        return self.texts  # type: ignore[return-value]


def _q(b: bytes) -> str:
    s = b.decode("utf-8", "replace")
    if len(s) > 40:
        s = s[:40] + "..."
    return repr(s)


def _type_name(t: int) -> str:
    return f"{VOCAB_TYPE_NAMES.get(t, 'unknown')} ({t})"


def compare_vocabs(tgt: VocabSummary, dft: VocabSummary) -> None:
    """Apply the reference's rules in order; raise for the first that fails."""
    if tgt.vocab_type != dft.vocab_type:
        raise IncompatibleDraftModel(
            "vocab_type", f"vocab type differs: target {_type_name(tgt.vocab_type)} vs draft "
                          f"{_type_name(dft.vocab_type)}")
    if tgt.add_bos != dft.add_bos or (tgt.add_bos and tgt.bos != dft.bos):
        raise IncompatibleDraftModel(
            "bos", f"BOS token differs: target add_bos={tgt.add_bos} id={tgt.bos} vs draft "
                   f"add_bos={dft.add_bos} id={dft.bos}")
    if tgt.add_eos != dft.add_eos or (tgt.add_eos and tgt.eos != dft.eos):
        raise IncompatibleDraftModel(
            "eos", f"EOS token differs: target add_eos={tgt.add_eos} id={tgt.eos} vs draft "
                   f"add_eos={dft.add_eos} id={dft.eos}")
    diff = abs(tgt.n_tokens - dft.n_tokens)
    if diff > VOCAB_MAX_SIZE_DIFFERENCE:
        raise IncompatibleDraftModel(
            "vocab_size", f"vocab size difference {diff} is over {VOCAB_MAX_SIZE_DIFFERENCE} "
                          f"(target {tgt.n_tokens} tokens, draft {dft.n_tokens})")
    n = min(tgt.n_tokens, dft.n_tokens)
    start = VOCAB_CHECK_START_TOKEN_ID
    if n <= start:
        return
    a = tgt.text_list()
    b = dft.text_list()
    if a[start:n] == b[start:n]:  # one C-level comparison in the common case
        return
    for i in range(start, n):
        if a[i] != b[i]:
            raise IncompatibleDraftModel(
                "token_text", f"token text at id {i} differs: {_q(a[i])} vs {_q(b[i])}")


# -- loaded models -------------------------------------------------------------

def _model_texts(model) -> Callable[[], list]:
    import llama_cpp as lc
    get_text = lc.llama_vocab_get_text
    vocab = model.vocab
    n = model.n_vocab

    def texts() -> list:
        # ~0.1 s for 262k tokens: one ctypes call each (c_char_p -> bytes up to NUL)
        return [get_text(vocab, i) or b"" for i in range(n)]
    return texts


def vocab_of_model(model) -> VocabSummary:
    """The check's inputs from a loaded :class:`~speculators.llama.Model`."""
    i = model.info
    return VocabSummary(vocab_type=i.vocab_type, add_bos=i.add_bos, bos=i.bos, add_eos=i.add_eos,
                        eos=i.eos, n_tokens=i.n_vocab, texts=_model_texts(model))


_checked_lock = threading.Lock()
_checked: set[tuple] = set()


def _model_key(model) -> tuple:
    try:
        st = os.stat(model.path)
        ident: tuple = (st.st_size, st.st_mtime_ns)
    except OSError:
        ident = ()
    return (ctypes.cast(model.ptr, ctypes.c_void_p).value, model.path, model.n_vocab, *ident)


def check_compatible(target, draft) -> None:
    """Raise :class:`IncompatibleDraftModel` unless ``draft`` can draft for ``target``.

    Both are loaded :class:`~speculators.llama.Model` s. Pairs that passed
    are remembered (by native pointer, path, size and mtime) so rebuilding the chain
    does not compare 262k token texts again.
    """
    key = (_model_key(target), _model_key(draft))
    with _checked_lock:
        if key in _checked:
            return
    compare_vocabs(vocab_of_model(target), vocab_of_model(draft))
    with _checked_lock:
        _checked.add(key)


# -- files (metadata only) -------------------------------------------------------

# BPE pre-tokenizers for which llama.cpp turns add_bos on by default
_BPE_PRE_ADD_BOS = frozenset({
    "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
    "jina-v5-nano", "tekken", "chameleon",
})
# BPE pre-tokenizers for which llama.cpp has no BOS token by default
_BPE_PRE_NO_BOS = frozenset({"chatglm-bpe", "glm4", "glm5"})
# BPE pre-tokenizers of the Gemma 4 type (add_bos forced on)
_BPE_PRE_GEMMA4 = frozenset({"gemma4", "granite-embed-multi-311m"})
_DNA_KMER_MARKER = b"\xee\x80\x80"
NULL = -1


class VocabUnreadable(ValueError):
    """The file's metadata has no vocabulary llama.cpp could load."""


#: ``tokenizer.ggml.model`` → (llama.cpp's vocab type, its default BOS id, its default EOS id)
_VOCAB_TYPES: dict[str, tuple[int, int, int]] = {
    "llama": (1, 1, 2), "bert": (3, 101, NULL), "gpt2": (2, 11, 11), "hybriddna": (2, 11, 11),
    "whitespace": (2, 11, 11), "t5": (4, NULL, 1), "rwkv": (5, NULL, NULL), "test": (7, NULL, NULL),
    "plamo2": (6, 1, 2), "gemma4": (2, NULL, NULL),
}
#: vocab type → its default (add BOS, add EOS); BPE (2) reads them from the pre-tokenizer
_VOCAB_ADDS: dict[int, tuple[bool, bool]] = {1: (True, False), 3: (True, False), 4: (False, True), 5: (False, False)}


def _vocab_defaults(model: str, pre: str) -> tuple[int, int, int, bool, bool, bool]:
    """``(vtype, bos, eos, add_bos, add_eos, gemma4)`` before the file's own keys: the vocab type's
    defaults, and for BPE the pre-tokenizer's (no BOS, BOS added, Gemma 4's forced BOS)."""
    if model not in _VOCAB_TYPES:
        raise VocabUnreadable(f"unknown tokenizer: {model!r}")
    vtype, bos, eos = _VOCAB_TYPES[model]
    if model == "gemma4":
        pre = "gemma4"
    add_bos, add_eos = _VOCAB_ADDS.get(vtype, (False, False))
    gemma4 = False
    if vtype == 2:
        if pre in _BPE_PRE_NO_BOS:
            bos = NULL
        if pre in _BPE_PRE_ADD_BOS:
            add_bos = True
        gemma4 = pre in _BPE_PRE_GEMMA4
    return vtype, bos, eos, add_bos, add_eos, gemma4


def _special_id(info, default: int, key: str, n: int) -> int:
    """A special token's id: the default (dropped when out of range), or the file's ``key`` read as
    uint32 where it is in range."""
    tid = default
    if tid >= 0 and tid >= n:
        tid = NULL
    v = info.get_int(key)
    if v is not None:
        v &= 0xFFFFFFFF  # read as uint32
        if v < n:
            tid = v
    return tid


def _token_texts(raw: list, model: str, n: int) -> list:
    """The token texts as llama.cpp keeps them: cut at a NUL, an empty one named ``[EMPTY_i]``; for
    ``hybriddna``, the k-mer marker dropped from the tokens after the (last) ``<oov>``."""
    out = list(raw)
    for i, b in enumerate(raw):
        if not b or b"\0" in b:
            b = b.split(b"\0", 1)[0]
            out[i] = b if b else f"[EMPTY_{i}]".encode()
    if model == "hybriddna":
        oov = None
        for i, b in enumerate(out):
            if b == b"<oov>":
                oov = i  # token_to_id keeps the last one
        if oov is not None:
            m = len(_DNA_KMER_MARKER)
            for i in range(oov + 1, n):
                b = out[i]
                if len(b) > m and b.endswith(_DNA_KMER_MARKER):
                    out[i] = b[:-m]
    return out


def vocab_of_gguf(src) -> VocabSummary:
    """The check's inputs from a GGUF file's metadata, as llama.cpp's loader derives them.

    ``src`` is a path or a :class:`~speculators.gguf_detect.GGUFInfo`.
    Follows ``llama_vocab::impl::load``: the vocab type from
    ``tokenizer.ggml.model``; default BOS/EOS ids and add-BOS/EOS flags per
    type (and BPE pre-tokenizer); ids out of range dropped; ids and flags
    from the file's keys where present and valid; token texts truncated at
    a NUL, empty ones named ``[EMPTY_i]``.
    """
    from .gguf_detect import GGUFInfo, GGUFStringArray, T_BOOL, T_STRING, read_gguf

    info = src if isinstance(src, GGUFInfo) else read_gguf(src, tensors=False)
    kv, kt = info.kv, info.kv_types

    def get_str(key: str) -> str | None:
        return kv[key] if kt.get(key, (None,))[0] == T_STRING else None

    model = get_str("tokenizer.ggml.model")
    if model is None:
        raise VocabUnreadable("the file has no tokenizer (tokenizer.ggml.model)")
    if model in ("no_vocab", "none"):
        n = info.get_int(f"{info.architecture}.vocab_size") or 0
        return VocabSummary(0, False, NULL, False, NULL, n, texts=lambda: [b""] * n)
    vtype, bos, eos, add_bos, add_eos, gemma4 = _vocab_defaults(model, get_str("tokenizer.ggml.pre") or "")

    tokens = kv.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, GGUFStringArray):
        raise VocabUnreadable("the file has no token list (tokenizer.ggml.tokens)")
    n = len(tokens)
    bos = _special_id(info, bos, "tokenizer.ggml.bos_token_id", n)
    eos = _special_id(info, eos, "tokenizer.ggml.eos_token_id", n)
    if kt.get("tokenizer.ggml.add_bos_token", (None,))[0] == T_BOOL:
        add_bos = bool(kv["tokenizer.ggml.add_bos_token"])
    if kt.get("tokenizer.ggml.add_eos_token", (None,))[0] == T_BOOL:
        add_eos = bool(kv["tokenizer.ggml.add_eos_token"])
    if gemma4 and not add_bos:
        add_bos = True
    return VocabSummary(vtype, add_bos, bos, add_eos, eos, n, texts=lambda: _token_texts(tokens.raw(), model, n))


@dataclass
class Compatibility:
    """The verdict for one pair: ``ok``, else the failed ``rule`` and the reason."""

    ok: bool
    rule: str | None = None
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.ok


def _summary(x) -> VocabSummary:
    if isinstance(x, VocabSummary):
        return x
    if hasattr(x, "vocab") and hasattr(x, "info"):
        return vocab_of_model(x)
    return vocab_of_gguf(os.fspath(x))


def compatibility(target, draft) -> Compatibility:
    """Like :func:`check_compatible` for models, paths or summaries, as a verdict.

    A file whose vocabulary cannot be read gets ``rule="unreadable"``.
    """
    from .gguf_detect import GGUFError
    try:
        t = _summary(target)
    except (GGUFError, VocabUnreadable, OSError) as e:
        return Compatibility(False, "unreadable", f"the target's vocabulary cannot be read: {e}")
    try:
        d = _summary(draft)
    except (GGUFError, VocabUnreadable, OSError) as e:
        return Compatibility(False, "unreadable", f"cannot read the vocabulary: {e}")
    try:
        compare_vocabs(t, d)
    except IncompatibleDraftModel as e:
        return Compatibility(False, e.rule, e.reason)
    return Compatibility(True)
