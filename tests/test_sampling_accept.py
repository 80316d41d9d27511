"""``sample_and_accept_n`` on scripted logits: the accept rule, EOG, greedy ties."""

from __future__ import annotations

import numpy as np

from speculators.sampling import Sampler, SamplingParams

EOG = 1
V = 16


class FakeModel:
    def is_eog(self, tok):
        return tok == EOG


class FakeCtx:
    """Row i's logits favour ``picks[i]`` (the target's own choice at that row)."""

    def __init__(self, picks):
        self.rows = []
        for p in picks:
            row = np.zeros(V, dtype=np.float32)
            row[p] = 5.0
            self.rows.append(row)

    def logits(self, i):
        return self.rows[i]


def accept(picks, draft):
    s = Sampler(SamplingParams(temperature=0.0), FakeModel())
    return s.sample_and_accept_n(FakeCtx(picks), range(len(draft) + 1), draft)


def test_all_agree_gives_the_draft_plus_one():
    assert accept([4, 5, 6, 7], [4, 5, 6]) == [4, 5, 6, 7]


def test_first_disagreement_replaces_the_draft_token():
    assert accept([4, 9, 6, 7], [4, 5, 6]) == [4, 9]
    assert accept([8, 5, 6, 7], [4, 5, 6]) == [8]


def test_no_draft_token_after_an_eog_is_accepted():
    # the target agrees with a drafted EOG in the middle: stop right there
    assert accept([4, EOG, 6, 7], [4, EOG, 6]) == [4, EOG]
    # a drafted EOG at the last position is kept, then the bonus token is sampled
    assert accept([4, 5, EOG, 7], [4, 5, EOG]) == [4, 5, EOG, 7]


def test_greedy_takes_the_first_maximum_like_llama_cpp():
    ctx = FakeCtx([3])
    ctx.rows[0][:] = 0.0
    ctx.rows[0][[2, 9]] = 7.0
    s = Sampler(SamplingParams(temperature=0.0), FakeModel())
    assert s.sample(ctx, 0) == 2


# -- the reply builder: stop strings, held-back text, limits ------------------

from speculators.engine import ReplyBuilder  # noqa: E402


class PieceModel:
    def __init__(self, pieces):
        self.pieces = pieces

    def is_eog(self, t):
        return t == 0

    def token_bytes(self, t):
        return self.pieces[t].encode()


def feed(pieces, ids, stop=(), max_tokens=100):
    rb = ReplyBuilder(PieceModel(pieces), stop, max_tokens)
    released, reason = [], None
    for i in ids:
        out, reason = rb.add(i, None, None)
        released.extend(out)
        if reason:
            break
    released.extend(rb.finish(reason))
    return rb, released, reason


def test_stop_string_split_over_tokens_never_shows():
    pieces = {1: "Paris", 2: ".", 3: "\n", 4: "Us", 5: "er", 6: ":", 7: " more"}
    rb, out, reason = feed(pieces, [1, 2, 3, 4, 5, 6, 7], stop=["\nUser:"])
    assert reason == "stop_string"
    assert rb.text == "Paris." and "".join(e.text for e in out) == "Paris."
    assert [e.index for e in out] == [0, 1]


def test_a_false_start_is_released_with_its_own_tokens():
    pieces = {1: "a", 3: "\n", 4: "Us", 8: "ually", 0: ""}
    rb, out, reason = feed(pieces, [1, 3, 4, 8, 0], stop=["\nUser:"])
    assert reason == "stop"
    assert [e.text for e in out] == ["a", "\n", "Us", "ually"]
    assert rb.text == "a\nUsually"


def test_stop_string_inside_one_token_cuts_that_token():
    pieces = {1: "ok", 2: "!END tail"}
    rb, out, reason = feed(pieces, [1, 2], stop=["END"])
    assert reason == "stop_string" and [e.text for e in out] == ["ok", "!"]


def test_max_tokens_releases_held_text_and_eog_is_not_emitted():
    pieces = {1: "x", 3: "\n", 0: ""}
    rb, out, reason = feed(pieces, [1, 3], stop=["\nUser:"], max_tokens=2)
    assert reason == "length" and rb.text == "x\n" and len(out) == 2
    rb, out, reason = feed(pieces, [1, 0, 1], stop=())
    assert reason == "stop" and [e.id for e in out] == [1]


def test_multibyte_characters_split_over_tokens():
    class Bytes(PieceModel):
        def token_bytes(self, t):
            return {1: "é".encode()[:1], 2: "é".encode()[1:], 3: b"!"}[t]
    rb = ReplyBuilder(Bytes({}), (), 10)
    texts = [e.text for i in (1, 2, 3) for e in rb.add(i, None, None)[0]]
    assert texts == ["", "é", "!"] and rb.text == "é!"


def test_sampling_never_draws_the_models_suppress_tokens(f16_engine):
    """Under sampling the target's sampler gives the model's suppress tokens a bias of -inf, as
    llama.cpp's common_sampler does: suppressing the two likeliest next tokens, 40 seeded draws
    at temperature 1.5 never land on them; without the suppression the likeliest one is drawn."""
    eng = f16_engine
    prompt = eng.model.tokenize("The capital of France is")
    eng.ctx.clear()
    eng.kv_tokens = []
    eng.ctx.decode(prompt, 0, logits="last")
    top = [int(t) for t in np.argsort(eng.ctx.logits(-1))[::-1][:2]]

    class _Model:
        def __init__(self, suppress):
            self.suppress_tokens = suppress
            self.n_vocab = eng.model.n_vocab

        def is_eog(self, t):
            return eng.model.is_eog(t)

    def draws(suppress) -> list[int]:
        return [Sampler(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed),
                        _Model(suppress)).sample(eng.ctx, -1) for seed in range(1, 41)]

    try:
        assert not set(draws(np.array(top, dtype=np.int64))) & set(top)
        assert top[0] in draws(None)
    finally:
        eng.ctx.clear()
        eng.kv_tokens = []
