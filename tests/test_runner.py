"""The model in a runner process: the chat survives the engine dying, on the real default model.

The runner is killed by real signals (from outside, as the kernel or a crash in
llama.cpp would end it, or by itself through the test hook in ``app.runner``),
and the session must keep the partial reply and the history, say what happened,
and answer the next message from a fresh runner.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app import config as config_mod
from app import session as sess
from app.options import ModelOptions
from app.runner import CRASH_ENV, CRASH_ONCE_ENV, EventBatches, RunnerEngine, telling_lines
from app.session import ChatSession
from app.storage import History
from speculators.params import SpecParams

from .test_session import drain

pytestmark = pytest.mark.slow

#: at temperature 0 the default model answers this with a long reply (it does not stop by itself)
LONG = "Count from 1 to 100, separated by commas."


def runner_session(tmp_path, model: Path, env: dict | None = None, spec: str = "none", max_tokens: int = 400,
                   **kw) -> tuple[ChatSession, queue.Queue]:
    cfg = config_mod.Config()
    cfg.model = ModelOptions(model=str(model), ctx_size=1024, threads=2)
    cfg.spec = SpecParams.from_types(spec) if spec != "none" else SpecParams()
    cfg.sampling.temperature = 0.0
    cfg.max_tokens = max_tokens
    q: queue.Queue = queue.Queue()
    factory = (lambda m, sp, p: RunnerEngine(m, sp, p, env=env)) if env else None
    s = ChatSession(cfg, post=q.put, engine_factory=factory, history=History(tmp_path / "h.sqlite3"),
                    persist_config=False, lookup_root=tmp_path / "lookup", **kw)
    s.load()
    drain(s, q, lambda: s.engine is not None or s.load_error is not None, timeout=120)
    assert s.load_error is None, s.load_error
    return s, q


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGKILL], ids=["SIGSEGV", "SIGKILL"])
def test_the_chat_survives_its_runner_killed_mid_reply(tmp_path, default_model_path, sig):
    s, q = runner_session(tmp_path, default_model_path)
    eng = s.engine
    assert isinstance(eng, RunnerEngine) and eng.alive and eng.pid != os.getpid()
    first_pid = eng.pid
    reply = s.send(LONG)
    drain(s, q, lambda: len(reply.tokens) >= 3 or s.job is None, timeout=120)
    assert s.job is not None, "the reply ended before the runner could be killed"
    os.kill(first_pid, sig)
    events = drain(s, q, lambda: s.job is None, timeout=120)
    failed = [e for e in events if isinstance(e, sess.ReplyFailed)]
    assert failed, [type(e).__name__ for e in events]
    msg = failed[0].error
    assert sig.name in msg and "the reply was cut here" in msg and "fresh runner" in msg
    # the reply so far is kept, in the chat and in the history
    assert reply.tokens and reply.text and len(reply.tokens) < 400
    assert reply.error == msg
    stored = s.history.load_chat(s.chat_id).messages
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[0].content == LONG and stored[1].content == reply.text and stored[1].status == "error"
    # the next message is answered by a fresh runner, with the whole conversation
    nxt = s.send("Say hello.")
    drain(s, q, lambda: s.job is None, timeout=120)
    assert nxt.error is None and nxt.text and nxt.status == "done"
    assert eng.alive and eng.pid != first_pid and eng.starts == 2
    assert len(s.history.load_chat(s.chat_id).messages) == 4
    s.close()
    assert not eng.alive


def test_the_same_crash_twice_stops_the_restart_until_the_settings_change(tmp_path, default_model_path):
    s, q = runner_session(tmp_path, default_model_path, env={CRASH_ENV: "segv:2"})
    eng = s.engine
    r1 = s.send(LONG)
    drain(s, q, lambda: s.job is None, timeout=120)
    assert "SIGSEGV" in r1.error and "fresh runner" in r1.error
    r2 = s.send(LONG)
    drain(s, q, lambda: s.job is None, timeout=120)
    assert "twice in a row" in r2.error and "not started again" in r2.error
    starts = eng.starts
    # no loop: the next message is refused, no runner is started
    r3 = s.send("Hello")
    drain(s, q, lambda: s.job is None, timeout=120)
    assert "twice in a row" in r3.error and eng.starts == starts and not eng.alive
    # other settings are worth another try: a runner starts again
    spec = SpecParams.from_types("ngram-simple")
    assert s.apply_settings(spec, s.config.sampling, s.config.model, s.config.max_tokens) == "rebuild"
    drain(s, q, lambda: eng.alive and s.active_types == ["ngram-simple"], timeout=60)
    assert eng.starts == starts + 1
    s.close()


def next_stopped(s, q, timeout: float = 120) -> sess.RunnerStopped:
    """Apply the session's events until the runner says it stopped between replies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ev = q.get(timeout=0.05)
        except queue.Empty:
            continue
        s.apply(ev)
        if isinstance(ev, sess.RunnerStopped):
            return ev
    raise AssertionError("the chat was not told that the runner stopped")


def test_a_runner_that_dies_between_replies_is_said_and_started_again_but_not_twice(tmp_path, default_model_path):
    s, q = runner_session(tmp_path, default_model_path)
    eng = s.engine
    first = s.send("Say hello.")
    drain(s, q, lambda: s.job is None, timeout=120)
    assert first.status == "done"
    pid = eng.pid
    os.kill(pid, signal.SIGSEGV)          # nothing is waiting on it: no reply is running
    ev = next_stopped(s, q)
    assert not ev.gave_up
    assert "between replies" in ev.message and "SIGSEGV" in ev.message and "nothing in the chat was lost" in ev.message
    assert eng.alive and eng.pid != pid and eng.starts == 2
    # the next message is answered by the fresh runner, with the conversation so far
    nxt = s.send("Say hello again.")
    drain(s, q, lambda: s.job is None, timeout=120)
    assert nxt.status == "done" and nxt.text and len(s.history.load_chat(s.chat_id).messages) == 4
    # the same death twice in a row (no good reply between): said, and not started again
    pid = eng.pid
    os.kill(pid, signal.SIGKILL)
    assert not next_stopped(s, q).gave_up and eng.alive
    os.kill(eng.pid, signal.SIGKILL)
    ev = next_stopped(s, q)
    assert ev.gave_up and "twice in a row" in ev.message and "SIGKILL" in ev.message
    time.sleep(1.0)
    starts = eng.starts
    assert not eng.alive
    r = s.send("Hello")
    drain(s, q, lambda: s.job is None, timeout=60)
    assert "twice in a row" in (r.error or "") and eng.starts == starts and not eng.alive
    s.close()


def test_esc_stops_a_runner_stuck_in_native_code(tmp_path, default_model_path):
    once = tmp_path / "hung-once"
    s, q = runner_session(tmp_path, default_model_path, env={CRASH_ENV: "hang:3", CRASH_ONCE_ENV: str(once)})
    eng = s.engine
    pid = eng.pid
    reply = s.send(LONG)
    drain(s, q, lambda: once.exists() and len(reply.tokens) >= 2, timeout=120)
    t0 = time.monotonic()
    s.stop()
    drain(s, q, lambda: s.job is None, timeout=RunnerEngine.GRACE_S + 15)
    assert time.monotonic() - t0 < RunnerEngine.GRACE_S + 10
    assert reply.status == "cancelled" and reply.tokens and reply.error is None
    # the stuck runner was killed; a fresh one answers
    nxt = s.send("Say hello.")
    drain(s, q, lambda: s.job is None, timeout=120)
    assert nxt.text and nxt.error is None and eng.pid != pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    s.close()


def test_the_chat_process_loads_no_model_and_the_runner_keeps_the_lookup_caches(tmp_path, default_model_path,
                                                                                monkeypatch):
    import speculators.llama as native

    def refuse(*a, **k):
        raise AssertionError("the chat's own process loaded a model")

    for cls in (native.Model, native.Context):
        monkeypatch.setattr(cls, "__init__", refuse)
    s, q = runner_session(tmp_path, default_model_path, spec="ngram-cache", max_tokens=24)
    assert s.store is not None and s.active_types == ["ngram-cache"]
    s.send("List the days of the week.")
    drain(s, q, lambda: s.lookup_last_save is not None and s.job is None, timeout=120)
    assert not s.lookup_last_save.get("error")
    fig = s.lookup_figures()
    assert fig["caches"]["dynamic"]["entries"] > 0 and set(fig["sources"]) == {"context", "dynamic", "static"}
    dyn = Path(fig["folder"]) / "dynamic.bin"
    assert dyn.exists() and dyn.is_relative_to(tmp_path)
    saved = dyn.read_bytes()
    # a runner killed after the save: the file is as it was saved, and the next runner reads it
    eng = s.engine
    os.kill(eng.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not (eng.starts == 2 and eng.alive):     # restarted between replies, before anyone asks
        assert time.monotonic() < deadline
        time.sleep(0.05)
    s.lookup_last_save = None
    nxt = s.send("Name three colours.")
    drain(s, q, lambda: s.job is None and s.lookup_last_save is not None, timeout=120)
    assert nxt.text and nxt.error is None
    from speculators.ngram_cache import NgramCache
    assert NgramCache.load(dyn).n_entries >= fig["caches"]["dynamic"]["entries"]
    assert len(saved) > 0
    s.close()


def _is_runner(pid: int) -> bool:
    try:
        return b"app.runner_child" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            with open(task / "children") as f:
                out += [int(x) for x in f.read().split()]
        except FileNotFoundError:    # the thread ended between listing and reading
            continue
    return out


def _long_generate(model) -> tuple[subprocess.Popen, bytes, list[int]]:
    """``draftlight generate`` of a long reply, once it has begun: (its process, the reply's
    first bytes, its children)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen([sys.executable, "-m", "app", "generate", "-m", str(model), "--raw",
                          "-p", "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "-n", "3000", "--spec-type", "none",
                          "--temp", "0", "-t", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                         cwd=Path(__file__).parent.parent)
    first = p.stdout.read(8)     # the reply has begun
    assert first, p.stderr.read()
    return p, first, _children(p.pid)


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc")
def test_generate_whose_engine_crashes_prints_one_clear_line(tmp_path, default_model_path):
    p, first, kids = _long_generate(default_model_path)
    assert len(kids) == 1, "generate should run its engine in a supervised child"
    os.kill(kids[0], signal.SIGSEGV)
    rest = p.stdout.read()
    err = p.stderr.read().decode()
    assert p.wait(30) == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("draftlight: error: `draftlight generate` stopped: the engine was killed by SIGSEGV")
    assert "--extra-bufts off" in lines[0] and "Traceback" not in err
    assert len(first + rest) < 3000 * 2


def test_event_batches_send_the_first_event_at_once_then_what_came_meanwhile():
    sent: list = []
    b = EventBatches(sent.append, every_s=0.3)
    b.put(0)
    deadline = time.monotonic() + 5
    while not sent and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sent == [[0]]
    for i in range(1, 40):
        b.put(i)
    time.sleep(0.05)
    # what came within every_s of the last batch waits for the next
    assert len(sent) == 1
    b.close()
    assert [ev for m in sent for ev in m] == list(range(40))
    assert len(sent) <= 3


def test_a_replys_first_token_crosses_at_once_though_an_empty_step_came_first(monkeypatch):
    """Where events are batched, the reply's first token is not held for the batch interval
    behind an empty step (a first token the engine held back as the possible start of a stop
    string): the time to the first token is what a person waits for. With the interval at 30 s,
    on the old code the token came 30 s late."""
    import threading
    from multiprocessing import Pipe
    from types import SimpleNamespace

    from app import runner_child as runner_mod
    from app import runner_protocol as rp
    from speculators.events import StepEvent, TokenEvent

    release = threading.Event()

    class Engine:
        ctx = SimpleNamespace(n_threads=runner_mod.usable_cores())     # takes every core: batched

        def generate(self, prompt, cancel, **kw):
            yield StepEvent([])
            time.sleep(0.3)         # the next token's decode: the empty step has gone by now
            yield StepEvent([TokenEvent(0, 5, " A", None, None)])
            release.wait(20)
            yield StepEvent([TokenEvent(1, 6, " walk", None, None)])

    monkeypatch.setattr(EventBatches, "EVERY_CONTENDED_S", 30.0)
    ours, theirs = Pipe()
    r = runner_mod.Runner(theirs)
    r.engine = Engine()
    assert runner_mod.contended(r.engine)
    t = threading.Thread(target=r.generate, args=(rp.Generate(1, [1, 2, 3]),), daemon=True)
    t.start()
    try:
        got: list = []
        deadline = time.monotonic() + 10
        while not any(ev.tokens for ev in got) and ours.poll(max(0.0, deadline - time.monotonic())):
            got.extend(ours.recv().events)
        assert [tok.text for ev in got for tok in ev.tokens] == [" A"]
    finally:
        release.set()
        t.join(60)
    rest = []
    while ours.poll(0.5):
        rest.extend(ours.recv().events)
    assert [tok.text for ev in rest for tok in ev.tokens] == [" walk"]


def test_stop_reaches_the_runner_without_the_reply_threads_poll(tmp_path, default_model_path):
    """``stop`` (the chat's Esc) is sent to the runner at once, from the UI's thread: the reply
    ends though its ``cancel`` callable never says so."""
    import threading
    from speculators.events import FinishEvent, StepEvent
    from speculators.sampling import SamplingParams
    eng = RunnerEngine(ModelOptions(model=str(default_model_path), ctx_size=1024, threads=2), SpecParams())
    try:
        prompt = eng.prompt_tokens(text=LONG)
        steps, result = 0, None
        for ev in eng.generate(prompt, max_tokens=400, sampling=SamplingParams(temperature=0.0),
                               cancel=lambda: False):
            if isinstance(ev, StepEvent):
                steps += 1
                if steps == 3:
                    threading.Thread(target=eng.stop).start()
            elif isinstance(ev, FinishEvent):
                result = ev.result
        assert result is not None and result.finish_reason == "cancelled"
        assert 3 <= len(result.tokens) < 400
        assert eng.alive and eng.starts == 1
        eng.stop()          # nothing in progress: nothing sent, nothing breaks
        again = eng.run(prompt, max_tokens=5, sampling=SamplingParams(temperature=0.0))
        assert again.finish_reason != "cancelled" and len(again.tokens) == 5
    finally:
        eng.close()


def test_a_reply_left_unread_does_not_answer_the_next_request(tmp_path, default_model_path):
    """A caller that stops reading a reply early (closes the generator, as a ``break`` does) does
    not leave the rest of it in the pipe for the next request: that request gets its own answer,
    and the same reply as a runner that was never interrupted. On the old code the next
    ``prompt_tokens`` got the rest of the reply (None) and ``generate`` failed."""
    from speculators.events import StepEvent
    from speculators.sampling import SamplingParams
    eng = RunnerEngine(ModelOptions(model=str(default_model_path), ctx_size=1024, threads=2), SpecParams())
    try:
        prompt = eng.prompt_tokens(text=LONG)
        eng.run(prompt, max_tokens=40, sampling=SamplingParams(temperature=0.0))
        # the prompt again, as the reply below will have it: from the prefix kept in the context
        want = eng.run(prompt, max_tokens=40, sampling=SamplingParams(temperature=0.0))
        for ev in eng.generate(prompt, max_tokens=400, sampling=SamplingParams(temperature=0.0)):
            if isinstance(ev, StepEvent) and ev.tokens:
                break                      # the generator is closed here, mid-reply
        assert eng.prompt_tokens(text=LONG) == prompt
        again = eng.run(prompt, max_tokens=40, sampling=SamplingParams(temperature=0.0))
        assert again.tokens == want.tokens and again.finish_reason == want.finish_reason
        assert eng.alive and eng.starts == 1        # stopped and read to its end, not killed
    finally:
        eng.close()


def test_telling_lines_leave_out_pythons_stack_dump():
    lines = ["llama_model_load: loaded", "Fatal Python error: Segmentation fault", "",
             "Current thread 0x00007f (most recent call first):", '  File "x.py", line 3 in f',
             "ggml_backend_amx_mul_mat: oops"]
    assert telling_lines(lines, 2) == ["llama_model_load: loaded", "ggml_backend_amx_mul_mat: oops"]


def test_a_model_that_cannot_load_is_a_clear_error_and_leaves_no_runner(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 4000)
    cfg = config_mod.Config()
    cfg.model = ModelOptions(model=str(junk), ctx_size=256)
    q: queue.Queue = queue.Queue()
    s = ChatSession(cfg, post=q.put, history=History(tmp_path / "h.sqlite3"), persist_config=False)
    before = set(_children(os.getpid()))
    s.load()
    drain(s, q, lambda: s.load_error is not None or s.engine is not None, timeout=60)
    assert s.engine is None and "damaged GGUF header" in s.load_error and "Traceback" not in s.load_error
    deadline = time.monotonic() + 10
    while left := [p for p in set(_children(os.getpid())) - before if _is_runner(p)]:
        assert time.monotonic() < deadline, f"a runner was left running: {left}"
        time.sleep(0.05)
    s.close()


def test_a_runner_that_cannot_be_started_again_is_said_once_not_retried_in_a_loop(tmp_path, default_model_path):
    """The model file gone when the runner dies between replies: the restart fails, says why,
    and is not tried again and again (it was: ~4 restarts a second)."""
    import shutil
    from app.options import ModelOptions
    model = tmp_path / "m.gguf"
    shutil.copy(default_model_path, model)
    told: list[str] = []
    eng = RunnerEngine(ModelOptions(model=str(model), ctx_size=256, threads=2), SpecParams())
    eng.on_idle_death = lambda msg, gave_up: told.append(msg)
    model.unlink()
    os.kill(eng.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while not told and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(told) == 1 and "between replies" in told[0] and "could not be started again" in told[0], told
    assert "model file not found" in told[0]
    time.sleep(3)
    assert eng.starts == 2 and not eng.alive and len(told) == 1
    eng.close()


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie nobody reaped counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_a_supervised_command_stopped_from_outside_takes_its_engine_with_it(default_model_path, sig):
    """``kill PID`` of ``draftlight bench`` (the PID a person sees: the supervisor) stopped only
    the supervisor, and its child went on decoding as an orphan, a core busy, until its work
    was done (a 12-prompt bench: most of an hour). A TERM is passed on, and the child of a
    supervisor killed outright stops within a few seconds."""
    p, _, kids = _long_generate(default_model_path)
    assert len(kids) == 1
    os.kill(p.pid, sig)
    rc = p.wait(30)
    deadline = time.monotonic() + 15
    while not _gone(kids[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    stopped = _gone(kids[0])
    if not stopped:
        os.kill(kids[0], signal.SIGKILL)
    assert stopped, "the engine's process went on after its supervisor was stopped"
    err = p.stderr.read().decode()
    if sig == signal.SIGTERM:
        # stopped as asked: the exit status says so, and nothing is reported as a crash
        assert rc == 128 + signal.SIGTERM and "stopped: the engine" not in err, (rc, err)
