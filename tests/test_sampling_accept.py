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
