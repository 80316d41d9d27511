"""Automatic never verifies draft tokens past the point where the reply would end, nor the token
that ends it (the verify brings that one itself).

A copy of the person's message runs to its end and on into the template (the transcript's next
"\\nAssistant:" and the copy again, or the chat template's turn end): the lookup drafters propose
all of it. Whatever follows the end of generation or a completed stop string could only cost a
verify, so the controller cuts the draft there (ReplyBuilder.useful); and the token that ends
the reply, were the ones before it accepted, is the verify's own next token: drafting it only
makes the batch one longer.
"""
from __future__ import annotations

from speculators import controller as controller_mod
from speculators.sampling import SamplingParams

PASTE = ("Repeat this paragraph exactly: The lighthouse keeper climbed the hundred and twelve steps every "
         "evening at dusk. He carried a can of oil, a cloth, and a small notebook in which he wrote the "
         "weather, the ships he saw, and the colour of the sea.")


def test_a_copy_that_reaches_the_end_of_the_message_is_verified_no_further(default_model_path, monkeypatch):
    from app.options import ModelOptions
    from app.runtime import open_engine
    from speculators.params import SpecParams

    from speculators.controller import ControllerParams
    from speculators.costcurve import CostCurve

    eng = open_engine(ModelOptions(model=str(default_model_path), threads=2), SpecParams())
    # a verify-cost curve where long drafts pay, given (not measured, nor refined by the steps'
    # times): how long a draft is worth verifying is the machine's (on the AMX VM, with the
    # repacked weights, a 16-token verify costs ~6 one-token steps, and a curve measured on a busy
    # moment may cut this copy's drafts to 8); what is tested is where the draft stops
    eng.controller_params = ControllerParams(online_cost=False)
    eng.cost_curve = CostCurve({k: 1.0 + 0.1 * k for k in range(65)}, t1_s=0.025)
    eng.set_spec(SpecParams.auto())
    try:
        verified: list[list[int]] = []
        decide = controller_mod.Controller.decide

        def logged(self, req):
            d = decide(self, req)
            if d.draft:
                verified.append((req.pos0, list(d.draft)))
            return d
        monkeypatch.setattr(controller_mod.Controller, "decide", logged)
        stop = tuple(eng.template.stop_strings)
        prompt = eng.prompt_tokens(text=PASTE)
        res = eng.run(prompt, max_tokens=200, sampling=SamplingParams(temperature=0.0), stop=stop)
        model = eng.model
    finally:
        eng.close()
    assert "the colour of the sea." in res.text and res.stats.n_accepted >= 20
    assert res.finish_reason in ("stop_string", "eog")
    longest = max((d for _, d in verified), key=len)
    assert len(longest) >= 16, "the copy was not drafted long"
    written = res.written
    for pos0, draft in verified:
        assert not any(model.is_eog(t) for t in draft), f"an end-of-generation token was drafted: {draft}"
        text = model.detokenize(draft)
        for s in stop:
            j = text.find(s)
            assert j < 0, f"a draft completes the stop string {s!r}: {text!r}"
        # the reply's last token (the stop string's last) is never a verified draft token
        off = pos0 + 1 - len(prompt)            # where in what was written the draft begins
        k = len(written) - off                  # its tokens through the reply's last one
        assert not (0 < k <= len(draft) and draft[:k] == written[off:]), \
            f"the draft {text!r} verified the reply's last token"
