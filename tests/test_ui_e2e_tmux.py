"""End to end: the real installed ``draftlight`` on the real default model, in tmux.

1. type a prompt, see the reply stream with ngram-mod's drafted tokens coloured, quit cleanly;
2. kill -9 the app mid-reply, start it again, and find the chat intact;
3. a new user's first runs (no flags, no config): the chat learns the dynamic lookup cache;
4. a small context keeps chatting past its limit;
5. the model runner killed by SIGSEGV mid-reply: the chat says so, keeps the reply, answers the next;
   killed between replies: the chat says so and starts it again.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.storage import History

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

def _sgr(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"38;2;{r};{g};{b}"


#: the dark theme's ngram-mod colour as a truecolor SGR parameter (from the theme's own data)
NGRAM_MOD_SGR = _sgr(__import__("themes").load_all(None)[0]["dark"].draft["ngram-mod"].fg)


def draftlight_command() -> list[str]:
    exe = Path(sys.executable).with_name("draftlight")
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-m", "app"]  # pragma: no cover - a checkout without the script


class Tmux:
    def __init__(self, tmp: Path, width: int = 100, height: int = 40):
        self.socket = f"draftlight-test-{os.getpid()}-{time.monotonic_ns()}"
        self.tmp = tmp
        self.width, self.height = width, height
        self.env = {k: os.environ[k] for k in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME",
                                               "XDG_STATE_HOME", "HOME", "PATH") if k in os.environ}
        self.env.update(TERM="xterm-256color", COLORTERM="truecolor", LANG="C.UTF-8")
        self.started = False

    def tmux(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=20)
        if check and out.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {out.stderr}")
        return out.stdout

    def start(self, argv: list[str], pidfile: Path) -> None:
        envs = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        # a clean environment: pytest's COLUMNS/LINES would fix the app's size at 80x24
        inner = f"echo $$ > {shlex.quote(str(pidfile))}; exec env -i {envs} {shlex.join(argv)}"
        cmd = f"sh -c {shlex.quote(inner)}; echo DRAFTLIGHT-EXIT=$?; sleep 60"
        if not self.started:
            # a placeholder first, so the pane has its final size before the app reads it
            self.tmux("new-session", "-d", "-s", "t", "-x", str(self.width), "-y", str(self.height), "sleep 600")
            self.tmux("resize-window", "-t", "t", "-x", str(self.width), "-y", str(self.height))
            self.started = True
        self.tmux("respawn-pane", "-k", "-t", "t", cmd)

    def screen(self, escapes: bool = False) -> str:
        return self.tmux("capture-pane", "-p", *(["-e"] if escapes else []), "-t", "t")

    def keys(self, *keys: str, literal: bool = False) -> None:
        self.tmux("send-keys", "-t", "t", *(["-l"] if literal else []), *keys)

    def wait_for(self, pattern: str, timeout: float = 60.0, escapes: bool = False) -> str:
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern, re.M)
        while True:
            s = self.screen(escapes)
            if rx.search(s):
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} did not appear; the screen:\n{self.screen()}")
            time.sleep(0.2)

    def wait_reply_done(self, timeout: float = 90.0) -> str:
        """Until a reply footer is on screen and nothing is being written."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.screen()
            if re.search(r"▌ \d+ tok · ", s) and "writing…" not in s and re.search(r"ready\s*$", s, re.M):
                return s
            if time.monotonic() > deadline:
                raise AssertionError(f"the reply did not finish; the screen:\n{s}")
            time.sleep(0.2)

    def close(self) -> None:
        self.tmux("kill-server", check=False)


@pytest.fixture
def tmux(tmp_path):
    t = Tmux(tmp_path)
    yield t
    t.close()


def _args(model: Path, *extra: str) -> list[str]:
    # ngram-mod with a short match length, so that a reply repeating its prompt is drafted
    return [*draftlight_command(), "--model", str(model), "--spec-type", "ngram-mod",
            "--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "2", "--temp", "0", "-t", "2", *extra]


COPY_PROMPT = ("Copy this text exactly: one two three four five six seven eight nine ten "
               "one two three four five six seven eight nine ten")


def test_chat_streams_a_reply_with_coloured_ngram_mod_drafts_and_quits(tmux, tmp_path, default_model_path):
    tmux.start(_args(default_model_path, "-n", "64"), tmp_path / "pid")
    tmux.wait_for(r"ready\s*$")
    tmux.keys(COPY_PROMPT, literal=True)
    tmux.keys("Enter")
    screen = tmux.wait_reply_done()
    coloured = tmux.screen(escapes=True)
    assert "Copy this text exactly" in screen
    reply_lines = [ln for ln in coloured.splitlines() if "▌" in ln and NGRAM_MOD_SGR in ln]
    assert reply_lines, "no ngram-mod coloured tokens in the reply:\n" + screen
    assert "by ngram-mod" in tmux.screen()
    tmux.keys("C-q")
    tmux.wait_for(r"DRAFTLIGHT-EXIT=0", timeout=20)


#: greedy, the default model counts on and on: a reply that is still streaming when a test kills something
COUNT_PROMPT = "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"


def start_a_long_reply(tmux, model: Path, pidfile: Path, n: int = 3000) -> str:
    """Start the app, send COUNT_PROMPT and wait until the reply streams; returns the prompt.

    ``n`` is the chat's reply limit: every later reply of the test is held to it too (after a
    count the model may go on "Hello, " + "Hello, " … to the limit)."""
    tmux.start(_args(model, "-n", str(n)), pidfile)
    tmux.wait_for(r"ready\s*$")
    tmux.keys(COUNT_PROMPT, literal=True)
    tmux.keys("Enter")
    tmux.wait_for(r"\d+ tok · .*drafted")
    return COUNT_PROMPT


def test_killed_mid_reply_the_chat_is_intact_after_a_restart(tmux, tmp_path, default_model_path):
    pidfile = tmp_path / "pid"
    prompt = start_a_long_reply(tmux, default_model_path, pidfile)
    time.sleep(1.5)  # the streaming reply is saved twice a second
    pid = int(pidfile.read_text())
    os.kill(pid, 9)
    tmux.wait_for(r"DRAFTLIGHT-EXIT=137", timeout=20)
    # what the store holds now: the chat, the prompt, the reply as far as it had come
    h = History()
    chats = h.list_chats()
    assert len(chats) == 1 and chats[0].title == prompt
    chat = h.load_chat(chats[0].id)
    assert [m.role for m in chat.messages] == ["user", "assistant"]
    assert chat.messages[0].content == prompt
    partial = chat.messages[1]
    assert partial.interrupted and len(partial.tokens) > 0 and partial.content
    assert "".join(t.text for t in partial.tokens) == partial.content
    assert h.integrity_ok()
    h.close()
    # restart and resume it
    tmux.start(_args(default_model_path), pidfile)
    tmux.wait_for(r"ready\s*$")
    tmux.keys("F2")
    tmux.wait_for(r"Chats[\s\S]*" + re.escape(prompt[:20]))    # the dialog, with the chat listed
    tmux.keys("Enter")
    screen = tmux.wait_for(r"interrupted")
    assert prompt[:24] in screen
    first_words = partial.content.strip().split()[0]
    assert first_words in screen
    tmux.keys("C-q")
    tmux.wait_for(r"DRAFTLIGHT-EXIT=0", timeout=20)


def test_a_new_user_chats_quits_and_the_next_run_finds_the_lookup_cache_grown(tmux, tmp_path):
    """No flags, no config: the default model is assembled, Automatic speculation learns as it chats."""
    from app import paths
    pidfile = tmp_path / "pid"
    tmux.start(draftlight_command(), pidfile)
    tmux.wait_for(r"ready\s*$", timeout=240)   # the first run assembles the default model
    tmux.keys("List the days of the week.", literal=True)
    tmux.keys("Enter")
    tmux.wait_reply_done(timeout=180)
    tmux.keys("C-q")
    tmux.wait_for(r"DRAFTLIGHT-EXIT=0", timeout=30)
    found = sorted(paths.lookup_dir().glob("*/dynamic.bin"))
    assert len(found) == 1, f"no dynamic cache under {paths.lookup_dir()}"
    dyn = found[0]
    size1 = dyn.stat().st_size
    assert size1 > 0
    tmux.start(draftlight_command(), pidfile)
    tmux.wait_for(r"ready\s*$", timeout=120)
    tmux.keys("Name three colours of the rainbow.", literal=True)
    tmux.keys("Enter")
    tmux.wait_reply_done(timeout=180)
    tmux.keys("C-q")
    tmux.wait_for(r"DRAFTLIGHT-EXIT=0", timeout=30)
    assert dyn.stat().st_size > size1
    # nothing was written outside the test's own folders
    assert dyn.is_relative_to(tmp_path)


def test_a_small_context_keeps_chatting_past_its_limit(tmux, tmp_path, default_model_path):
    """-c 256: the conversation outgrows the context; every message still gets a reply."""
    tmux.start([*draftlight_command(), "--model", str(default_model_path), "-c", "256", "-n", "32",
                "--temp", "0", "-t", "2"], tmp_path / "pid")
    tmux.wait_for(r"ready\s*$")
    para = ("Here is a note about my garden: the tomatoes are red, the beans climb the fence, the "
            "lettuce grows fast in spring, and the herbs smell of summer. ")
    def replies_done() -> int:
        h = History()
        try:
            chats = h.list_chats()
            msgs = h.load_chat(chats[0].id).messages if chats else []
            return sum(1 for m in msgs if m.role == "assistant" and m.status == "done")
        finally:
            h.close()

    for i in range(5):
        tmux.keys(f"Message {i}. {para}What should I plant next?", literal=True)
        tmux.keys("Enter")
        deadline = time.monotonic() + 120
        while replies_done() < i + 1:
            assert time.monotonic() < deadline, f"reply {i} did not finish:\n{tmux.screen()}"
            time.sleep(0.3)
        screen = tmux.wait_reply_done(timeout=60)
        assert "context holds" not in screen and "error" not in screen.lower()
    h = History()
    chat = h.load_chat(h.list_chats()[0].id)
    assert [m.role for m in chat.messages] == ["user", "assistant"] * 5   # the history keeps them all
    assert all(m.status == "done" and m.content for m in chat.messages if m.role == "assistant")
    h.close()
    # the chat marks where the model's view now begins
    tmux.keys("PageUp")
    tmux.keys("PageUp")
    deadline = time.monotonic() + 10
    while "no longer sees" not in tmux.screen() and time.monotonic() < deadline:
        tmux.keys("PageUp")
        time.sleep(0.3)
    assert "no longer sees" in tmux.screen()
    tmux.keys("C-q")
    tmux.wait_for(r"DRAFTLIGHT-EXIT=0", timeout=20)


def _runner_pid(app_pid: int) -> int:
    """The app's model runner: its child process running app.runner_child."""
    for task in Path(f"/proc/{app_pid}/task").glob("*"):
        try:
            kids = (task / "children").read_text().split()
        except FileNotFoundError:    # the thread ended between listing and reading
            continue
        for kid in kids:
            try:
                if b"app.runner_child" in Path(f"/proc/{kid}/cmdline").read_bytes():
                    return int(kid)
            except FileNotFoundError:
                continue
    raise AssertionError("the app has no model runner process")


def test_the_runner_crashing_mid_reply_leaves_the_chat_running(tmux, tmp_path, default_model_path):
    """A segmentation fault in the engine: the chat says so in place, keeps the reply, answers the next."""
    import signal
    pidfile = tmp_path / "pid"
    # 400 tokens: the count still streams when the signal comes (sent as soon as it streams),
    # and the answer to "Say hello." after it (a run of "Hello, " to the limit) is held to it
    start_a_long_reply(tmux, default_model_path, pidfile, n=400)
    app_pid = int(pidfile.read_text())
    runner = _runner_pid(app_pid)
    os.kill(runner, signal.SIGSEGV)
    screen = tmux.wait_for(r"SIGSEGV", timeout=30)
    assert "cut here" in screen and "fresh runner" in screen.replace("\n", " ")
    os.kill(app_pid, 0)                          # the app itself is still running
    tmux.keys("Say hello.", literal=True)
    tmux.keys("Enter")
    tmux.wait_reply_done(timeout=120)
    assert _runner_pid(app_pid) != runner
    h = History()
    msgs = h.load_chat(h.list_chats()[0].id).messages
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[1].status == "error" and msgs[1].content and msgs[1].tokens    # the cut reply, kept
    assert msgs[3].status == "done" and msgs[3].content
    h.close()
    # killed between replies (nothing waits on it): said all the same, and started again
    second = _runner_pid(app_pid)
    os.kill(second, signal.SIGKILL)
    tmux.wait_for(r"between[\s▌]+replies", timeout=60)       # a notice: its lines wrap inside a frame
    tmux.wait_for(r"was[\s▌]+lost", timeout=60)
    assert "SIGKILL" in tmux.screen().replace("\n", " ")
    assert _runner_pid(app_pid) not in (runner, second)
    tmux.keys("C-q")
    tmux.wait_for(r"DRAFTLIGHT-EXIT=0", timeout=20)


def test_the_first_run_shows_the_default_models_preparation_then_chats(tmux, tmp_path, private_dirs):
    """A fresh data folder: the embedded default model is assembled with a progress bar in
    the chat, then loaded ("Loading the model…", no bar stuck at 100 %), then the chat is ready."""
    from app.models import default_model_path as where
    assert not where().exists()
    tmux.start([*draftlight_command(), "--spec-type", "none", "-t", "2", "-n", "8"], tmp_path / "pid")
    seen = tmux.wait_for(r"Preparing the default model \(first run\)", timeout=60)
    assert re.search(r"\d+%", seen), seen
    seq = ["100%" if "100%" in seen else "preparing"]       # the panel's states, in the order seen
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        s = tmux.screen()
        state = None
        if "Preparing the default model" in s:
            state = "100%" if "100%" in s else "preparing"
        elif "Checking once which llama.cpp CPU kernels" in s:
            state = "probe"                  # the first run probes the CPU's extra kernel types
        elif "Loading the model…" in s:
            state = "loading"
        elif re.search(r"ready\s*$", s, re.M):
            break
        if state and (not seq or seq[-1] != state):
            seq.append(state)
        time.sleep(0.05)
    else:
        raise AssertionError("not ready:\n" + tmux.screen())
    assert "preparing" in seq and "loading" in seq, seq
    # after the probe the panel says the model loads (it once kept "Checking…" through the load)
    assert "probe" not in seq or "loading" in seq[seq.index("probe"):], seq
    print("panel states:", seq)
    tmux.keys("Hello", literal=True)
    tmux.keys("Enter")
    tmux.wait_reply_done()
    assert where().exists()                                  # kept for the next start
    tmux.keys("C-q")
    tmux.wait_for(r"DRAFTLIGHT-EXIT=0", timeout=20)
