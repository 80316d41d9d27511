"""Checkpointed (hybrid) targets: speculator state kept with context checkpoints, and the
per-step checkpoint's restore and replay, counted as llama-server counts them.

What llama-server does (vendored ``tools/server/server-context.cpp``):

* a context checkpoint (``create_checkpoint``, made during prompt processing) stashes the
  speculators' state with it (``common_speculative_get_state``: EAGLE3's deferred boundary on
  a recurrent/hybrid target), and restoring that checkpoint for a later prompt restores it
  (``common_speculative_set_state``). The per-step draft checkpoint (``spec_ckpt``) keeps no
  speculator state.
* a verify whose rejected drafts the target cannot drop (no partial removal, or more than
  ``n_rs_seq`` to drop) restores the step's checkpoint and the sampler, emits nothing and does
  *not* call ``common_speculative_accept``; the accepted tokens (agreeing drafts plus the
  target's own) become the next step's draft (``spec_is_replay``): decoded again with every
  row's logits, verified, and only then accepted -- the drafter's per-speculator count takes
  the whole replay (the target's token too), the slot's ``draft_n_accepted`` one less.

The engine does the same; the native tests hold text, drafted/accepted and every
per-speculator counter against llama-server over a multi-turn chat on the hybrid target.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.predictable_models import expected_text, write_bigram_qwen35_mtp, write_eagle3_predictor
# resolved at import, before the tests' private XDG dirs are set (see test_native_llama_cpp)
from tests.test_native_llama_cpp import (  # noqa: F401  (as_llama_server: autouse)
    BIN, HAVE, _free_port, as_llama_server, cpu_flags, wait_healthy,
)

#: drafters wrong on these symbols: their drafts are rejected there (partial acceptance)
WRONG_SOME = "eknuz"
#: a prompt whose n-grams the bigram target leaves after "m": ngram-mod drafts "0 abc..." there
#: and the target rejects it, so checkpointed steps are restored and replayed
REPEATS = "abcdefghijklm0 abcdefghijklm0 abcdefghijklm0 abcdefghijklm0 a"
CHAT = [REPEATS, "xyz0 abcdefghijklm0 a", "hello world"]
N = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    d: Path = tmp_path_factory.mktemp("ckpt-state")
    return {"target": write_bigram_qwen35_mtp(d / "qwen35-mtp.gguf"),
            "eagle3": write_eagle3_predictor(d / "eagle3-qwen35-some.gguf", wrong=WRONG_SOME, n_embd=32,
                                             target_layers=(0, 1, 2), fc_from=2, fc_normed=True)}


def _engine(models, spec_type: str, reuse_prefix: bool = True, target: Path | None = None,
            drafter: Path | None = None):
    from speculators.engine import Engine, EngineConfig
    from speculators.params import SpecParams

    spec = SpecParams.from_types(spec_type)
    if "eagle3" in spec_type:
        spec.draft.model = str(drafter or models["eagle3"])
    eng = Engine(str(target or models["target"]), EngineConfig(n_ctx=1024, n_batch=512, n_threads=2,
                                                               reuse_prefix=reuse_prefix), spec)
    assert eng.chain.skipped == {}, eng.chain.skipped
    assert eng.use_checkpoints
    return eng


def _counters(s) -> tuple:
    """A speculator's counters in llama-server's order (``common_speculative_print_stats``)."""
    return (s.n_call_begin, s.n_call_draft, s.n_call_accept, s.n_gen_drafts, s.n_acc_drafts,
            s.n_gen_tokens, s.n_acc_tokens)


def _engine_chat(eng, turns, n_predict=N) -> list[tuple]:
    """Each turn's (text, drafted, accepted, reused, the chain's counters so far)."""
    from speculators.sampling import SamplingParams

    out, hist = [], ""
    for t in turns:
        hist += t
        r = eng.run(eng.prompt_tokens(text=hist, raw=True), max_tokens=n_predict,
                    sampling=SamplingParams(temperature=0.0))
        hist += r.text
        out.append((r.text, r.stats.n_drafted, r.stats.n_accepted, r.stats.n_prompt_reused,
                    {k: _counters(v) for k, v in eng.chain.stats().items()}))
    return out


def _count_restores(eng) -> list[int]:
    """Count the engine's state restores (per-step checkpoints and context checkpoints)."""
    n = [0]
    orig = eng.ctx.state_set

    def state_set(*a, **kw):
        n[0] += 1
        return orig(*a, **kw)
    eng.ctx.state_set = state_set
    return n


# -- without native binaries ----------------------------------------------------------------

def test_restored_step_is_replayed_and_counted_as_llama_server(models):
    """ngram-mod on the hybrid target (no recurrent snapshots: every drafted step is
    checkpointed): a rejected draft restores the checkpoint and the accepted tokens are
    replayed as the next step's draft. The counts are llama-server's (measured with the
    vendored llama-server on this model: draft_n 75, draft_n_accepted 24; ngram-mod's
    #calls(b,g,a) 1 38 2, gen drafts 2, acc drafts 2, gen tokens 75, acc tokens 25)."""
    eng = _engine(models, "ngram-mod", reuse_prefix=False)
    try:
        assert eng.seq_rm_type == "full" and eng.n_rs_seq == 0
        restores = _count_restores(eng)
        ((text, drafted, accepted, _, spec),) = _engine_chat(eng, [REPEATS])
        assert text == expected_text(REPEATS, N)
        assert (drafted, accepted) == (75, 24)
        assert spec["ngram-mod"] == (1, 38, 2, 2, 2, 75, 25)
        # the drafter's count takes each replay's target token: one more per restore
        assert restores[0] == 1 and spec["ngram-mod"][6] == accepted + restores[0]
    finally:
        eng.close()


def test_restored_step_keeps_the_sampler_state(models):
    """With temperature sampling, the restore puts the sampler back (llama-server's smpl_save):
    the replay draws the same random numbers, so the seeded reply is plain decoding's."""
    from speculators.sampling import SamplingParams

    def run(spec_type):
        eng = _engine(models, spec_type, reuse_prefix=False)
        try:
            r = eng.run(eng.prompt_tokens(text=REPEATS, raw=True), max_tokens=N,
                        sampling=SamplingParams(temperature=0.7, seed=42))
            return r.tokens, r.stats.n_drafted
        finally:
            eng.close()
    plain, _ = run("none")
    spec, drafted = run("ngram-mod")
    assert drafted > 0
    assert spec == plain


def test_context_checkpoint_restores_the_speculator_state(models):
    """The chain's state (EAGLE3's deferred boundary on the hybrid target) is stashed with every
    context checkpoint and put back when a later prompt restarts from that checkpoint."""
    eng = _engine(models, "draft-eagle3")
    try:
        (s,) = eng.chain.speculators
        calls = []
        orig = s.set_state

        def set_state(data):
            calls.append(bytes(data))
            orig(data)
        s.set_state = set_state
        (t1, *_), = _engine_chat(eng, CHAT[:1], 32)
        assert calls == []
        # checkpoints only in the prompt (4 + n_ubatch and 4 before its end) and at the reply's end,
        # and every one holds the boundary of the tokens before it
        assert 1 <= len(eng._prefix_ckpts) <= 3, [c[0] for c in eng._prefix_ckpts]
        for n, _state, spec_state, chain in eng._prefix_ckpts:
            assert chain is eng.chain and spec_state is not None
            assert struct.unpack("<i", spec_state[:4])[0] == n - 1
        saved = {c[0]: c[2] for c in eng._prefix_ckpts}
        ((_, _, _, reused, _),) = _engine_chat(eng, [CHAT[0] + t1 + CHAT[1]], 32)
        assert reused in saved
        assert calls == [saved[reused]]
    finally:
        eng.close()


# -- held against llama-server ----------------------------------------------------------------

STAT = re.compile(r"statistics\s+(\S+): #calls\(b,g,a\) = +(\d+) +(\d+) +(\d+), #gen drafts = +(\d+), "
                  r"#acc drafts = +(\d+), #gen tokens = +(\d+), #acc tokens = +(\d+)")


def _server_chat(target: Path, spec_type: str, turns, n_predict: int, extra=(), tmp: Path = Path(".")):
    """A multi-turn chat with one llama-server (its prompt cache and context checkpoints kept
    between turns): per turn (text, draft_n, draft_n_accepted, cache_n, the per-speculator
    counters so far, read from its trace log)."""
    port = _free_port()
    log = tmp / f"llama-server-{spec_type}.log"
    with open(log, "w") as logf:
        srv = subprocess.Popen([str(BIN / "llama-server"), "-m", str(target), "-t", "2", "-tb", "2", "-c", "1024",
                                "--no-warmup", "--port", str(port), "--host", "127.0.0.1", "--spec-type", spec_type,
                                "-np", "1", "--no-webui", "-lv", "4", *cpu_flags(target), *extra],
                               stdout=subprocess.DEVNULL, stderr=logf)
    out, hist = [], ""
    names = set(spec_type.split(","))
    try:
        wait_healthy(srv, port, lambda: log.read_text()[-2000:])
        for t in turns:
            hist += t
            body = json.dumps({"prompt": hist, "n_predict": n_predict, "temperature": 0,
                               "cache_prompt": True}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                         {"Content-Type": "application/json"})
            r = json.load(urllib.request.urlopen(req, timeout=300))
            hist += r["content"]
            spec: dict = {}
            for _ in range(50):  # the statistics are logged as the slot is released, a line per type
                spec = {m.group(1): tuple(int(x) for x in m.groups()[1:]) for m in STAT.finditer(log.read_text())}
                # every type's line of this turn (read between two of them, the log once gave
                # ngram-mod's alone)
                if set(spec) >= names and all(v[0] == len(out) + 1 for v in spec.values()):
                    break
                time.sleep(0.1)
            tm = r["timings"]
            out.append((r["content"], tm.get("draft_n", 0), tm.get("draft_n_accepted", 0), tm.get("cache_n", 0), spec))
    finally:
        srv.terminate()
        try:
            srv.wait(timeout=20)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
    return out


def _compare(models, spec_type: str, turns, n_predict: int, tmp: Path, target: Path | None = None,
             drafter: Path | None = None):
    target = target or models["target"]
    extra = ["-md", str(drafter or models["eagle3"])] if "eagle3" in spec_type else []
    theirs = _server_chat(target, spec_type, turns, n_predict, extra, tmp)
    eng = _engine(models, spec_type, target=target, drafter=drafter)
    try:
        ours = _engine_chat(eng, turns, n_predict)
    finally:
        eng.close()
    for i, (o, t) in enumerate(zip(ours, theirs)):
        assert o[0] == t[0], (spec_type, i, "text")
        assert o[1:3] == t[1:3], (spec_type, i, "drafted/accepted", o[1:3], t[1:3])
        assert o[3] == t[3], (spec_type, i, "prompt tokens reused", o[3], t[3])
        assert o[4] == t[4], (spec_type, i, "per-speculator (calls b,g,a, gen/acc drafts, gen/acc tokens)",
                              o[4], t[4])
    return theirs


native = pytest.mark.skipif(not HAVE, reason="native llama.cpp not built; run python tools/native.py build")


@native
@pytest.mark.slow
def test_restored_steps_match_llama_server(models, tmp_path):
    """ngram-mod on the hybrid target, three turns: restores and replays of per-step checkpoints
    and prefix reuse from context checkpoints give llama-server's text and counts."""
    theirs = _compare(models, "ngram-mod", CHAT, N, tmp_path)
    assert theirs[0][4]["ngram-mod"][6] > theirs[0][2]  # a restore happened (replay counted)


@native
@pytest.mark.slow
def test_eagle3_with_restored_steps_matches_llama_server(models, tmp_path):
    """EAGLE3 on the hybrid target behind ngram-mod (whose long drafts exceed the n_rs_seq
    snapshots, so their steps are checkpointed and restored) over a three-turn chat that reuses
    its prefix from context checkpoints (with EAGLE3's boundary stashed): llama-server's text,
    drafted/accepted and every per-speculator counter."""
    theirs = _compare(models, "ngram-mod,draft-eagle3", CHAT, N, tmp_path)
    assert theirs[-1][4]["draft-eagle3"][6] > 0 and theirs[1][3] > 0


@native
@pytest.mark.slow
def test_eagle3_chat_from_context_checkpoints_matches_llama_server(models, tmp_path):
    """EAGLE3 alone on the hybrid target (rollbacks from n_rs_seq snapshots, no per-step
    checkpoint), a chat whose later turns restart from context checkpoints."""
    theirs = _compare(models, "draft-eagle3", ["hello world", "the quick brown fox", "jumps over"], 32, tmp_path)
    assert all(t[3] > 0 for t in theirs[1:])


REALISTIC = os.environ.get("DRAFTLIGHT_REALISTIC_MODELS")


@native
@pytest.mark.slow
@pytest.mark.skipif(not REALISTIC, reason="set DRAFTLIGHT_REALISTIC_MODELS=DIR "
                                          "(python -m tests.build_models --realistic DIR)")
def test_realistic_hybrid_eagle3_with_restored_steps_matches_llama_server(models, tmp_path):
    """The realistic Q4 hybrid with the realistic EAGLE3 drafter behind ngram-mod, two turns."""
    d = Path(REALISTIC)
    turns = ["hello world, the quick brown fox jumps over the lazy dog. hello world, the quick",
             " and again: hello world, the quick"]
    _compare(models, "ngram-mod,draft-eagle3", turns, 24, tmp_path, target=d / "hybrid-mtp.gguf",
             drafter=d / "eagle3.gguf")
