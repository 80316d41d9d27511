"""What a learned dynamic lookup cache brings to ngram-cache (``bench --lookup-learn``): the
learning prompts answered first into a fresh in-memory cache (the user's cache folder is never
touched), then the bench prompts run without and with it."""

from __future__ import annotations

from speculators.params import SpecParams
from speculators.sampling import SamplingParams

from ..measure import Row
from .prompts import tokenize_prompts
from .report import progress
from .runs import measure_ceiling, timed_generation


def learning_rows(engine, learn_texts: list[str], prompts: list[list[int]], raw: bool, max_tokens: int,
                  spec: SpecParams, stop, none_row: Row, report: dict) -> list[Row]:
    """The two rows of :func:`lookup_learn_effect` (each against ``none_row``'s outputs, with its
    ceiling), its details put in ``report["lookup_learn"]``."""
    progress("lookup: learning")
    learn_prompts = tokenize_prompts(engine, learn_texts, raw, max_tokens, "a prompt to learn from")
    without, with_, details = lookup_learn_effect(engine, learn_prompts, prompts, max_tokens, spec, stop=stop)
    for row in (without, with_):
        row.equal_to_none = row.outputs == none_row.outputs
        if row.mean_draft_len >= 1:
            row.ceiling_tps = measure_ceiling(engine, prompts[0], round(row.mean_draft_len))
    report["lookup_learn"] = details
    return [without, with_]


def lookup_learn_effect(engine, learn_prompts: list[list[int]], prompts: list[list[int]], max_tokens: int,
                        spec: SpecParams | None = None, stop=()) -> tuple[Row, Row, dict]:
    """What a learned dynamic cache brings to ngram-cache: (without, with, details).

    First the ``learn_prompts`` are answered (greedy) with ngram-cache and a
    fresh, in-memory dynamic cache that learns after each reply as the app's
    lookup store does (:class:`app.lookup_store.Learner`); the user's cache
    folder is not touched. Then ``prompts`` are run twice with ngram-cache:
    with an empty dynamic cache, and with the learned one (frozen). Both
    runs use the same static cache (``spec``'s -lcs, if any), so the only
    difference is the dynamic cache.
    """
    from speculators.ngram_cache import NgramCache
    from speculators.types import SpecType

    from ..lookup_store import Learner, LookupStore, learn_tokens

    sp = (spec or SpecParams()).copy()
    sp.types = [SpecType.NGRAM_CACHE]
    sp.ngram_cache.lookup_cache_dynamic = None
    static = None
    if sp.ngram_cache.lookup_cache_static:
        from speculators.ngram_cache import load_lookup_cache
        static = load_lookup_cache(sp.ngram_cache.lookup_cache_static, "static", n_vocab=engine.model.n_vocab)
    greedy = SamplingParams(temperature=0.0)
    learned = NgramCache()
    learner = Learner()
    engine.set_spec(sp, resources={"lookup_static": static or NgramCache(), "lookup_dynamic": learned})
    n_learn_tokens = 0
    for p in learn_prompts:
        res = engine.run(p, max_tokens=max_tokens, sampling=greedy, stop=stop)
        seq = list(p) + list(res.tokens)
        learn_tokens(learned, seq, learner.new_from(seq))
        n_learn_tokens += len(res.tokens)
    rows = []
    sources = {}
    for name, dyn in (("ngram-cache, no dynamic", NgramCache()), ("ngram-cache, learned dyn", learned)):
        engine.set_spec(sp, resources={"lookup_static": static or NgramCache(), "lookup_dynamic": dyn})
        row = timed_generation(engine, prompts, max_tokens, stop=stop)
        row.name = name
        rows.append(row)
        sources[name] = LookupStore.contribution(engine)
    details = {
        "learn_prompts": len(learn_prompts),
        "learn_tokens": n_learn_tokens,
        "dynamic_ngrams": len(learned),
        "dynamic_entries": learned.n_entries,
        "without": {"drafted": rows[0].drafted, "accepted": rows[0].accepted,
                    "sources": sources[rows[0].name]},
        "with": {"drafted": rows[1].drafted, "accepted": rows[1].accepted,
                 "sources": sources[rows[1].name]},
    }
    return rows[0], rows[1], details
