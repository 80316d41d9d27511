"""The ``ngram-cache`` speculator: ``common_speculative_impl_ngram_cache`` of llama.cpp's
``common/speculative.cpp`` (a context cache grown from the conversation, plus an optional
dynamic and static cache read from lookup files), its declaration (flags, settings) and its
factory. Loads the configured cache files; drafts through :mod:`.draft`."""

from __future__ import annotations

import os
from typing import Sequence

from ..base import DraftRequest, Speculator
from ..chain import register
from ..descriptor import NGRAM, Nothing, SpecDescriptor, declare
from ..param_kinds import PATH, Param
from ..params import SpecParams
from ..types import SpecType
from .draft import SOURCE_NAMES, _draft_tail
from .errors import CorruptCacheError, LookupCacheError
from .keys import NGRAM_MAX, NGRAM_MIN, NGRAM_STATIC
from .table import NgramCache

#: Draft length of the speculator (``create_state_ngram_cache``).
N_DRAFT = 8


def load_lookup_cache(path: str | os.PathLike, kind: str, n_vocab: int | None = None) -> NgramCache:
    """Load an explicitly configured cache or raise :class:`LookupCacheError`.

    The file is only read (never moved or changed); given ``n_vocab`` it must not name a token
    outside the vocabulary (:func:`check_vocab`).
    """
    try:
        return NgramCache.load(path, n_vocab)
    except (OSError, CorruptCacheError) as e:
        reason = _reason_of(e, path) if isinstance(e, CorruptCacheError) else (e.strerror or str(e))
        raise LookupCacheError(os.fspath(path), kind, reason) from e


class NgramCacheSpeculator(Speculator):
    """``common_speculative_impl_ngram_cache`` for one sequence.

    At each draft the context cache is updated with the tokens of the
    prompt it has not seen yet plus ``id_last`` (n-grams of sizes 1..4
    *within that new stretch only*, exactly as llama.cpp does), then up to
    ``n_draft`` (8) tokens are drafted by :func:`ngram_cache_draft` from the
    context, dynamic and static caches. ``begin``, ``process`` and
    ``accept`` do nothing, as in llama.cpp.

    >>> spec = NgramCacheSpeculator()
    >>> history = [10, 11, 12, 13] * 3
    >>> spec.draft(DraftRequest(prompt=history, id_last=10, pos0=len(history)))
    [11, 12, 13, 10, 11, 12, 13, 10]
    >>> spec.context_cache[(12, 13, 10)]
    {11: 2}

    ``context_cache``, ``dynamic_cache`` and ``static_cache`` are public so
    that the application can, at the end, merge the context cache into the
    dynamic one and save it (``lookup``'s flow)::

        spec.dynamic_cache.merge(spec.context_cache)
        spec.dynamic_cache.save(path)

    ``source_drafted`` / ``source_accepted`` (draftlight's addition) count,
    per cache (``"context"``, ``"dynamic"``, ``"static"``), the drafted
    tokens each cache proposed and how many of them the target accepted
    (counted when the chain reports the acceptance of this speculator's
    draft). Drafting itself is unchanged.
    """

    type = SpecType.NGRAM_CACHE

    def __init__(self, n_draft: int = N_DRAFT, static_cache: NgramCache | None = None,
                 dynamic_cache: NgramCache | None = None):
        super().__init__(n_max=n_draft)
        self.n_draft = n_draft
        self.context_cache = NgramCache()
        self.dynamic_cache = dynamic_cache if dynamic_cache is not None else NgramCache()
        self.static_cache = static_cache if static_cache is not None else NgramCache()
        #: number of tokens (prompt + id_last) the context cache has seen
        self.cache_size = 0
        #: where the segment prepare() began, until a draft ends it (see :meth:`prepare`)
        self._seg_start: int | None = None
        #: per cache: drafted tokens it proposed / of those, accepted
        self.source_drafted = dict.fromkeys(SOURCE_NAMES, 0)
        self.source_accepted = dict.fromkeys(SOURCE_NAMES, 0)
        self._last_sources: list[int] = []

    @classmethod
    def from_params(cls, params: SpecParams, n_vocab: int | None = None) -> "NgramCacheSpeculator":
        """Build it, loading ``lookup_cache_static`` / ``lookup_cache_dynamic`` when set.

        A path that is set but cannot be read or is corrupt raises
        :class:`LookupCacheError` (llama.cpp aborts there), as does, given the
        model's ``n_vocab``, a cache naming a token outside its vocabulary.
        """
        nc = params.ngram_cache
        static = load_lookup_cache(nc.lookup_cache_static, "static", n_vocab) if nc.lookup_cache_static else None
        dynamic = (load_lookup_cache(nc.lookup_cache_dynamic, "dynamic", n_vocab)
                   if nc.lookup_cache_dynamic else None)
        return cls(N_DRAFT, static_cache=static, dynamic_cache=dynamic)

    def prepare(self, prompt: Sequence[int]) -> None:
        """While the target reads the prompt (Automatic's controller calls it; a fixed type never
        does): the context cache takes the prompt in now instead of at the first draft, which
        then adds the rest of the same segment (the n-grams ending at its own tokens, keys
        reaching back into the prompt): the same counts as without it, and the reply's first
        step no longer pays for the prompt (~0.6 ms for a 330-token chat transcript).

        >>> a, b = NgramCacheSpeculator(), NgramCacheSpeculator()
        >>> prompt = [5, 6, 7, 5, 6, 8, 5, 6]
        >>> a.prepare(prompt)
        >>> da, db = a.draft(DraftRequest(prompt, 7, 8, 4)), b.draft(DraftRequest(prompt, 7, 8, 4))
        >>> a.context_cache == b.context_cache and da == db and a.cache_size == b.cache_size == 9
        True
        """
        n = len(prompt)
        start = self.cache_size
        if start >= n:
            return
        seg, lo = self._segment(start)
        self.context_cache.update([int(t) for t in prompt[lo:n]], NGRAM_MIN, NGRAM_MAX, n - start)
        self.cache_size = n
        self._seg_start = seg

    def _segment(self, start: int) -> tuple[int, int]:
        """(where the segment that tokens from ``start`` on continue began, the first token an
        update of them must read: their n-grams' keys reach back into the segment)."""
        seg = start if self._seg_start is None else self._seg_start
        return seg, max(seg, start - NGRAM_MAX)

    def draft(self, req: DraftRequest) -> list[int]:
        prompt = req.prompt
        n_prompt = len(prompt)
        id_last = int(req.id_last)
        if self.cache_size < n_prompt + 1:
            start = self.cache_size
            # the new tokens are one segment with what prepare() took in (its last tokens reach
            # into the keys of the new ones), as they would have been without it
            _, lo = self._segment(start)
            self._seg_start = None
            tokens_new = [int(t) for t in prompt[lo:]]
            tokens_new.append(id_last)
            self.context_cache.update(tokens_new, NGRAM_MIN, NGRAM_MAX, n_prompt + 1 - start)
            self.cache_size = n_prompt + 1
        inp_size = n_prompt + 1
        if inp_size < NGRAM_STATIC:
            return []
        # The n-grams only ever reach the last NGRAM_MAX tokens: no copy of
        # the whole history is needed.
        tail = [int(t) for t in prompt[max(0, n_prompt - (NGRAM_MAX - 1)):]]
        tail.append(id_last)
        # Drafting is greedy, so stopping at the caller's limit gives the
        # same prefix that the chain would cut the full draft to.
        n_draft = self.n_draft if req.n_max <= 0 else min(self.n_draft, req.n_max)
        result = [id_last]
        sources: list[int] = []
        _draft_tail(tail, inp_size, result, n_draft, NGRAM_MIN, NGRAM_MAX,
                    self.context_cache._map, self.dynamic_cache._map, self.static_cache._map, sources)
        self._last_sources = sources
        return result[1:]

    def accept(self, n_accepted: int, is_other: bool) -> None:
        if is_other:
            return
        sources, self._last_sources = self._last_sources, []
        for i, src in enumerate(sources):
            name = SOURCE_NAMES[src]
            self.source_drafted[name] += 1
            if i < n_accepted:
                self.source_accepted[name] += 1


declare(SpecDescriptor(
    name="ngram-cache", rank=50, kind=NGRAM,
    info="lookup caches: a static and a dynamic file",
    needs=Nothing("always available: this conversation plus the learned lookup caches"),
    section="ngram_cache", n_max=lambda p: N_DRAFT,
    params=(Param("ngram_cache.lookup_cache_static", "static cache file", PATH, ("-lcs", "--lookup-cache-static"),
                  "static lookup cache for ngram-cache", dest="lookup_cache_static", metavar="FNAME",
                  hint="optional, must exist"),
            Param("ngram_cache.lookup_cache_dynamic", "dynamic cache file", PATH, ("-lcd", "--lookup-cache-dynamic"),
                  "dynamic lookup cache for ngram-cache", dest="lookup_cache_dynamic", metavar="FNAME",
                  hint="optional; learns as you chat"))))


@register(SpecType.NGRAM_CACHE)
def _create(params: SpecParams, resources: dict) -> Speculator:
    """Build the speculator; caches passed in ``resources`` win over params' paths.

    ``resources["lookup_static"]`` / ``resources["lookup_dynamic"]``, when
    present and not None, are :class:`NgramCache` objects used as they are
    (shared, not copied: the application's lookup store keeps learning into
    its dynamic cache and the speculator sees it). A cache not passed is
    loaded from ``params.ngram_cache`` as before, checked against the vocabulary
    of ``resources["model"]`` when there is one.
    """
    static = resources.get("lookup_static")
    dynamic = resources.get("lookup_dynamic")
    n_vocab = _vocab_size(resources.get("model"))
    if static is None and dynamic is None:
        return NgramCacheSpeculator.from_params(params, n_vocab)
    nc = params.ngram_cache
    if static is None and nc.lookup_cache_static:
        static = load_lookup_cache(nc.lookup_cache_static, "static", n_vocab)
    if dynamic is None and nc.lookup_cache_dynamic:
        dynamic = load_lookup_cache(nc.lookup_cache_dynamic, "dynamic", n_vocab)
    return NgramCacheSpeculator(N_DRAFT, static_cache=static, dynamic_cache=dynamic)


def _reason_of(e: BaseException, path: str | os.PathLike) -> str:
    """An error's message less the ``"<path>: "`` it begins with (the caller names the file)."""
    msg, prefix = str(e), f"{os.fspath(path)}: "
    return msg[len(prefix):] if msg.startswith(prefix) else msg


def _vocab_size(model) -> int | None:
    """A model's vocabulary size, or None where there is no model (or it has no such number)."""
    n = getattr(model, "n_vocab", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None
