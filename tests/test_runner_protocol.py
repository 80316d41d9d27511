"""The runner protocol (app/runner_protocol.py) on the real default model: answers cannot be
mixed up, a stop is seen while tokens stream and inside a decode, and nothing the UI reads
waits for a runner that is busy or stuck.

Each test here failed on the protocol before ids (one request at a time behind one lock,
a stop read only when the socket was quiet, a prefill that could not be stopped).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from app.options import ModelOptions
from app.runner import CRASH_ENV, CRASH_ONCE_ENV, RunnerEngine
from speculators.events import FinishEvent, StepEvent
from speculators.params import SpecParams
from speculators.sampling import SamplingParams

from .test_runner import LONG, runner_session
from .test_session import drain

pytestmark = pytest.mark.slow

GREEDY = SamplingParams(temperature=0.0)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie is gone for our purposes (its parent has not reaped it yet)
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def _long_text(n_words: int) -> str:
    words = ("the river keeps its own counsel while the town sleeps beside it and the bridges "
             "count the carts that cross them one by one until morning").split()
    return " ".join(words[i % len(words)] for i in range(n_words))


def test_a_stop_set_only_through_cancel_is_seen_while_tokens_stream(default_model_path):
    """``cancel()`` alone (Ctrl+N, F2 resume, the Lab's Cancel set only that flag) stops a reply
    whose tokens stream faster than the old poll's quiet interval: on the old code the reply ran
    to its 400 tokens."""
    eng = RunnerEngine(ModelOptions(model=str(default_model_path), ctx_size=1024, threads=2), SpecParams())
    # the quiet interval a stop was once read in, made longer than the reply: a stop must be seen
    # whether or not the socket is ever quiet (a fast model's stream never is)
    eng.POLL_S = 30.0
    try:
        prompt = eng.prompt_tokens(text=LONG)
        flag = threading.Event()
        result, steps, t_set = None, 0, None
        for ev in eng.generate(prompt, max_tokens=400, sampling=GREEDY, cancel=flag.is_set):
            if isinstance(ev, StepEvent) and ev.tokens:
                steps += 1
                if steps == 3:
                    flag.set()
                    t_set = time.monotonic()
            elif isinstance(ev, FinishEvent):
                result = ev.result
        took = time.monotonic() - t_set
        assert result is not None and result.finish_reason == "cancelled"
        assert len(result.tokens) < 60, f"{len(result.tokens)} tokens after the stop"
        assert took < 1.5, f"the stop took {took:.2f} s"
        assert eng.alive and eng.starts == 1
    finally:
        eng.close()


def test_a_cancelled_static_build_never_answers_the_next_request(tmp_path, default_model_path):
    """A static-cache build cancelled while the runner is inside a piece of text that takes
    longer than the grace (here the grace is 0 s) ends as cancelled; the runner's late answer
    is dropped, and each later request gets its own answer. On the old code the build raised an
    internal error and every later request got the previous one's answer."""
    from app.lookup_store import BuildCancelled
    eng = RunnerEngine(ModelOptions(model=str(default_model_path), ctx_size=1024, threads=2), SpecParams(),
                       lookup_root=tmp_path / "lookup")
    try:
        store, _ = eng.open_store(SpecParams.from_types("ngram-cache"), tmp_path / "lookup")
        assert store is not None
        corpus = tmp_path / "corpus.txt"
        corpus.write_text(_long_text(60_000), encoding="utf-8")
        eng.GRACE_S = 0.0
        with pytest.raises(BuildCancelled):
            store.build_static([str(corpus)], cancel=lambda: True)
        eng.GRACE_S = RunnerEngine.GRACE_S
        want = eng.prompt_tokens(text="Name three colours.")
        assert isinstance(want, list) and all(isinstance(t, int) for t in want)
        assert eng.prompt_tokens(text="Say hello.") != want
        assert eng.prompt_tokens(text="Name three colours.") == want
        learned = store.learn(want)
        assert learned == len(want)
        assert eng.alive and eng.starts == 1
    finally:
        eng.close()


def test_esc_during_a_long_prompt_stops_it_inside_the_decode_without_a_restart(default_model_path):
    """A stop while the runner reads a 2,000-token prompt aborts the decode in progress
    (llama.cpp's abort callback): the reply ends as stopped within half a second or so, by the
    same runner. On the old code the prompt was read to its end or, after 2 s, the runner was
    killed and the model loaded again."""
    eng = RunnerEngine(ModelOptions(model=str(default_model_path), ctx_size=4096, threads=2), SpecParams())
    try:
        prompt = eng.prompt_tokens(text=_long_text(2100), raw=True)
        assert len(prompt) >= 2000, len(prompt)
        timer = threading.Timer(0.3, eng.stop)
        t0 = time.monotonic()
        result = None
        try:
            timer.start()
            for ev in eng.generate(prompt, max_tokens=50, sampling=GREEDY):
                if isinstance(ev, FinishEvent):
                    result = ev.result
        finally:
            timer.cancel()
        took = time.monotonic() - t0 - 0.3
        assert result is not None and result.finish_reason == "cancelled"
        assert result.tokens == [] and "prompt" in result.message
        assert took < 1.0, f"the stop took {took:.2f} s"
        assert eng.alive and eng.starts == 1
        # the same runner answers, from a context that kept what it had read
        again = eng.run(prompt[:300], max_tokens=5, sampling=GREEDY)
        assert again.finish_reason != "cancelled" and len(again.tokens) == 5
    finally:
        eng.close()


def test_a_prompt_stopped_in_its_decode_reads_on_to_the_same_reply(f16_model_path):
    """What an aborted prompt left in the context is reused correctly: the reply after it is
    the reply of a runner that was never stopped (F16 weights: batching does not flip tokens)."""
    opts = ModelOptions(model=str(f16_model_path), ctx_size=4096, threads=2)
    eng = RunnerEngine(opts, SpecParams())
    try:
        prompt = eng.prompt_tokens(text=_long_text(700), raw=True)
        timer = threading.Timer(0.3, eng.stop)
        timer.start()
        stopped = eng.run(prompt, max_tokens=12, sampling=GREEDY)
        timer.cancel()
        assert stopped.finish_reason == "cancelled" and stopped.tokens == []
        after = eng.run(prompt, max_tokens=12, sampling=GREEDY)
    finally:
        eng.close()
    fresh = RunnerEngine(opts, SpecParams())
    try:
        want = fresh.run(prompt, max_tokens=12, sampling=GREEDY)
    finally:
        fresh.close()
    assert after.tokens == want.tokens


def test_nothing_the_ui_reads_waits_for_a_runner_stuck_in_native_code(tmp_path, default_model_path):
    """With the runner inside a 10-second native call mid-reply (the test hook), what the UI reads
    (the statistics panel's lookup figures, the engine's settings) comes back at once, Esc ends the
    reply as stopped within the grace, and closing the chat takes under 2 s and leaves no process.
    On the old code the lookup figures waited for the whole reply."""
    once = tmp_path / "stalled-once"
    s, q = runner_session(tmp_path, default_model_path, spec="ngram-cache",
                          env={CRASH_ENV: "stall:3:10", CRASH_ONCE_ENV: str(once)})
    eng = s.engine
    pid = eng.pid
    assert s.store is not None
    reply = s.send(LONG)
    drain(s, q, lambda: once.exists(), timeout=120)
    time.sleep(0.2)                                # inside the native call now
    t0 = time.monotonic()
    fig = s.lookup_figures()
    took = time.monotonic() - t0
    assert fig is not None and set(fig["caches"]) == {"static", "dynamic"}
    assert took < 0.1, f"the lookup figures took {took:.3f} s"
    t0 = time.monotonic()
    assert eng.spec is not None and eng.chain is not None and eng.ctx.n_ctx == 1024
    assert time.monotonic() - t0 < 0.05
    # a store closed by a speculation change (on the UI's thread) is not waited for either
    from app.runner import RunnerStore
    t0 = time.monotonic()
    RunnerStore(eng).close()
    assert time.monotonic() - t0 < 0.05
    # Esc: the stall cannot be aborted, so after the grace the runner is killed and the reply ends
    t0 = time.monotonic()
    s.stop()
    drain(s, q, lambda: s.job is None, timeout=RunnerEngine.GRACE_S + 10)
    assert time.monotonic() - t0 < RunnerEngine.GRACE_S + 2
    assert reply.status == "cancelled" and reply.tokens
    assert _gone(pid)
    # a fresh runner answers, and closing mid-reply is quick and complete
    drain(s, q, lambda: eng.alive and eng.pid != pid, timeout=60)
    nxt = s.send(LONG)
    drain(s, q, lambda: len(nxt.tokens) >= 2, timeout=120)
    pid2 = eng.pid
    t0 = time.monotonic()
    s.close()
    assert time.monotonic() - t0 < 2.0
    deadline = time.monotonic() + 2
    while not _gone(pid2) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid2)


def test_closing_while_the_runner_is_stuck_takes_under_two_seconds(tmp_path, default_model_path):
    """Ctrl+Q while the runner sits in a 10-second native call: the chat closes within 2 s, the
    reply is saved as stopped, and no runner is left behind."""
    from app.storage import History
    once = tmp_path / "stalled-once"
    s, q = runner_session(tmp_path, default_model_path, env={CRASH_ENV: "stall:3:10", CRASH_ONCE_ENV: str(once)})
    pid = s.engine.pid
    reply = s.send(LONG)
    drain(s, q, lambda: once.exists(), timeout=120)
    time.sleep(0.2)
    chat_id = s.chat_id
    t0 = time.monotonic()
    s.close()
    assert time.monotonic() - t0 < 2.0
    assert _gone(pid)
    saved = History(tmp_path / "h.sqlite3").load_chat(chat_id)
    assert saved.messages[-1].status == "cancelled"
    assert reply.status == "cancelled"


def test_closing_does_not_wait_for_a_runner_being_started_and_leaves_none(default_model_path):
    """A runner killed between replies is started again in the background (its model loading);
    closing the chat then returns at once, and the runner being started ends itself."""
    import signal
    eng = RunnerEngine(ModelOptions(model=str(default_model_path), ctx_size=1024, threads=2), SpecParams())
    first = eng.pid
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while eng.starts < 2:                     # the restart has spawned its runner, which loads now
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = eng.pid
    t0 = time.monotonic()
    eng.close(timeout=0.5)
    assert time.monotonic() - t0 < 1.0
    deadline = time.monotonic() + 15
    while not (_gone(first) and _gone(second)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(first) and _gone(second)


def test_a_runner_that_dies_while_a_restart_loads_it_is_said(default_model_path):
    """Nobody waits on a restart in the background: a runner killed while it loads its model
    (after the one before it died mid-reply) is said (the soak test saw it go unsaid)."""
    import signal
    from app.runner import RunnerCrashed
    told: list[tuple[str, bool]] = []
    eng = RunnerEngine(ModelOptions(model=str(default_model_path), ctx_size=1024, threads=2), SpecParams())
    eng.on_idle_death = lambda msg, gave_up: told.append((msg, gave_up))
    try:
        prompt = eng.prompt_tokens(text=LONG)
        with pytest.raises(RunnerCrashed):
            for ev in eng.generate(prompt, max_tokens=400, sampling=GREEDY):
                if isinstance(ev, StepEvent) and ev.tokens:
                    os.kill(eng.pid, signal.SIGSEGV)      # mid-reply: the reply says it
        deadline = time.monotonic() + 30
        while eng.starts < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(eng.pid, signal.SIGKILL)              # the fresh one, as it loads
        while not told:
            assert time.monotonic() < deadline + 30, "the death of the runner being started was not said"
            time.sleep(0.05)
        assert "SIGKILL" in told[0][0], told
    finally:
        eng.close()
