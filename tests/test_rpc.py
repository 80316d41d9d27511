"""Models over other machines' devices: llama.cpp's RPC backend, with real ``rpc-server`` processes.

Two ``draftlight rpc-server`` processes (ggml's own server, from the installed
llama.cpp) listen on 127.0.0.1; the model's layers are split over them and the
local CPU, and every run must give exactly the all-local text, tokens and
draft counts. Each client is a process of its own (``draftlight generate``,
or the chat's runner): RPC devices, once added, stay in a process's device
list, and must not leak into the other tests' models.

These tests need a llama-cpp-python built with ``-DGGML_RPC=on`` (the README's
install builds it so); on another build they skip, and ``.ci/run`` fails on
that skip.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from speculators import devices as dv
from speculators.llama import backend_init

from .hidden_models import (  # noqa: F401  (session fixtures)
    dflash_path, eagle3_path, hidden_models_dir, llama_target_path, qwen35_mtp_path,
)

ROOT = Path(__file__).resolve().parents[1]

backend_init()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not dv.has_rpc(), reason="this llama-cpp-python was built without RPC "
                                                "(CMAKE_ARGS=\"-DGGML_RPC=on\", as the README's install builds it)"),
]

#: a prompt every n-gram drafter drafts on with the F16 copy, with rejections as well as acceptances
REPEAT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    """A ``draftlight rpc-server`` process on 127.0.0.1."""

    def __init__(self, threads: int = 1):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.log = open(os.devnull, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "app", "rpc-server", "-p", str(self.port),
                                      "-t", str(threads)], cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                dv.probe_rpc_server(self.endpoint, timeout=2)
                return
            except dv.RpcError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"rpc-server on {self.endpoint} did not start")
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def two_servers():
    servers = [RpcServer(), RpcServer()]
    yield [s.endpoint for s in servers]
    for s in servers:
        s.stop()


def generate(model: Path, *extra: str, prompt: str = REPEAT, n: int = 64, spec: str = "none",
             check: bool = True) -> dict | subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "app", "generate", "--no-config", "-m", str(model), "--raw", "-p", prompt,
           "-n", str(n), "--temp", "0", "-t", "1", "-c", "1024", "--spec-type", spec, "--json",
           "--no-lookup-store", *extra]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    if not check:
        return r
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def same_run(a: dict, b: dict) -> None:
    assert a["text"] == b["text"]
    assert a["tokens"] == b["tokens"]
    assert a["drafted_by"] == b["drafted_by"] and a["draft_pos"] == b["draft_pos"]
    for k in ("n_drafted", "n_accepted", "n_steps"):
        assert a["stats"][k] == b["stats"][k], k


# -- the server and the probe -------------------------------------------------------------------

def test_rpc_server_refuses_a_non_loopback_address_without_the_flag():
    r = subprocess.run([sys.executable, "-m", "app", "rpc-server", "-H", "0.0.0.0", "-p", str(free_port())],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "refusing to listen on 0.0.0.0" in r.stderr and "--allow-remote" in r.stderr
    assert "Starting RPC server" not in r.stdout


def test_rpc_server_on_an_open_address_warns_as_llama_cpp_does():
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "app", "rpc-server", "-H", "0.0.0.0", "-p", str(port), "-t", "1",
                          "--allow-remote"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                info = dv.probe_rpc_server(f"127.0.0.1:{port}", timeout=2)
                break
            except dv.RpcError:
                time.sleep(0.2)
        else:
            pytest.fail("the server did not start")
        assert info.version[0] == dv.RPC_PROTO_MAJOR and len(info.devices) == 1
    finally:
        p.kill()
        _, err = p.communicate(timeout=10)
    assert "no authentication" in err and "Never expose the RPC server to an open network" in err


def test_a_second_server_on_a_taken_port_says_so(two_servers):
    port = two_servers[0].rpartition(":")[2]
    r = subprocess.run([sys.executable, "-m", "app", "rpc-server", "-p", port], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "Address already in use" in r.stderr


def _fake_server(reply: bytes | None) -> tuple[str, threading.Thread, socket.socket]:
    """A TCP server that reads a HELLO and answers ``reply`` (None: never answers)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        with conn:
            conn.recv(64)
            if reply is not None:
                conn.sendall(reply)
            time.sleep(3)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return f"127.0.0.1:{srv.getsockname()[1]}", t, srv


def test_probe_says_which_protocol_a_server_speaks():
    import struct
    ep, t, srv = _fake_server(struct.pack("<Q", 28) + bytes([6, 1, 0, 0]) + bytes(24))
    with srv, pytest.raises(dv.RpcError, match=r"speaks protocol 6\.1\.0, this llama\.cpp 7\.x"):
        dv.probe_rpc_server(ep, timeout=2)


def test_probe_of_a_server_that_never_answers_times_out_with_a_reason():
    ep, t, srv = _fake_server(None)
    with srv, pytest.raises(dv.RpcUnavailable, match="did not answer within 1 s .*one client at a time"):
        dv.probe_rpc_server(ep, timeout=1)


def test_probe_of_nothing_listening_is_a_clear_error():
    with pytest.raises(dv.RpcUnavailable, match=r"cannot reach RPC server 127\.0\.0\.1:\d+: Connection refused"):
        dv.probe_rpc_server(f"127.0.0.1:{free_port()}", timeout=2)


def test_join_on_a_build_without_rpc_names_the_install(monkeypatch):
    from app.options import ModelOptions
    from app.runtime import join_rpc_servers
    monkeypatch.setattr(dv, "has_rpc", lambda: False)
    with pytest.raises(dv.RpcError, match=r"lacks; reinstall with it: CMAKE_ARGS=\"-DGGML_RPC=on\""):
        join_rpc_servers(ModelOptions(rpc="127.0.0.1:50052"))


def test_doctor_lists_remote_devices_and_an_unusable_server(two_servers):
    bad = f"127.0.0.1:{free_port()}"
    r = subprocess.run([sys.executable, "-m", "app", "doctor", "--json", "--rpc", ",".join([*two_servers, bad])],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["rpc"]["built"] is True
    servers = {s["endpoint"]: s for s in rep["rpc"]["servers"]}
    for ep in two_servers:
        assert servers[ep]["ok"] and servers[ep]["version"].startswith(f"{dv.RPC_PROTO_MAJOR}.")
        assert servers[ep]["devices"][0]["memory_total"] > 0
    assert not servers[bad]["ok"] and "Connection refused" in servers[bad]["error"]
    remote = [d for d in rep["devices"] if d["type"] == "rpc"]
    assert sorted(d["description"] for d in remote) == sorted(two_servers)
    assert all(d["memory_total"] > 0 for d in remote)


# -- the same text and counts as all-local ------------------------------------------------------------

SPLIT_TYPES = ["none", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]


def _runs(model: Path, *extra: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "tests.rpc_runs", str(model), REPEAT, "40", ",".join(SPLIT_TYPES),
                        *extra], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def local_and_split_runs(two_servers, f16_model_path):
    # 12 of 19 layers offloaded, spread over the two servers' devices; the rest on the local CPU
    return _runs(f16_model_path), _runs(f16_model_path, "--rpc", ",".join(two_servers), "-ngl", "12")


@pytest.mark.parametrize("spec", SPLIT_TYPES)
def test_split_over_two_rpc_servers_and_the_cpu_gives_the_all_local_run(local_and_split_runs, spec):
    local, split = (runs[spec] for runs in local_and_split_runs)
    same_run(local, split)
    if spec != "none":
        st = split["stats"]
        assert 0 < st["n_accepted"] < st["n_drafted"], st     # accepted drafts and rolled-back rejections


def test_tensor_split_and_device_choice_place_every_layer_remotely(two_servers, f16_model_path):
    local = generate(f16_model_path, spec="ngram-mod")
    remote = generate(f16_model_path, "--rpc", ",".join(two_servers), "-ngl", "99", "-dev", "RPC0,RPC1",
                      "-ts", "3,1", spec="ngram-mod")
    same_run(local, remote)


def test_draft_simple_with_the_drafter_local_and_the_target_remote_is_lossless(two_servers, f16_model_path,
                                                                               default_model_path):
    plain = generate(f16_model_path, spec="none")
    spec = generate(f16_model_path, "--rpc", two_servers[0], "-ngl", "99", "-md", str(default_model_path),
                    "-devd", "none", "-ngld", "0", "--spec-draft-n-max", "4", spec="draft-simple")
    assert spec["text"] == plain["text"] and spec["tokens"] == plain["tokens"]
    assert spec["stats"]["n_accepted"] > 0
    assert set(filter(None, spec["drafted_by"])) == {"draft-simple"}


@pytest.mark.parametrize("kind", ["draft-eagle3", "draft-dflash"])
def test_a_hidden_state_drafter_reads_the_features_of_a_target_served_remotely(
        two_servers, llama_target_path, eagle3_path, dflash_path, kind):
    drafter = eagle3_path if kind == "draft-eagle3" else dflash_path
    prompt = "a b c d e f g a b c d"
    local = generate(llama_target_path, "-md", str(drafter), prompt=prompt, n=24, spec=kind)
    # the drafter's layers stay on this machine's CPU (-ngld 0); its devices follow the target's
    remote = generate(llama_target_path, "--rpc", ",".join(two_servers), "-ngl", "99", "-md", str(drafter),
                      "-ngld", "0", prompt=prompt, n=24, spec=kind)
    same_run(local, remote)
    assert remote["stats"]["n_drafted"] > 0


@pytest.mark.parametrize("kind", ["draft-eagle3", "draft-dflash"])
def test_a_hidden_state_drafter_kept_off_the_targets_devices_is_refused_not_aborted(
        two_servers, llama_target_path, eagle3_path, dflash_path, kind):
    """The drafter's graph uses the target's output matrix, which lives on RPC0: a drafter limited
    to the CPU (-devd none) would make ggml abort ("pre-allocated tensor ... cannot run")."""
    drafter = eagle3_path if kind == "draft-eagle3" else dflash_path
    r = generate(llama_target_path, "--rpc", two_servers[0], "-ngl", "99", "-md", str(drafter), "-devd", "none",
                 prompt="a b c a b c", n=8, spec=kind, check=False)
    assert r.returncode == 0, r.stderr[-1500:]
    assert f"{kind} is off: its drafter uses the target's output and embedding tensors, which are on RPC0; " \
           f"-devd none leaves it out" in r.stderr
    assert json.loads(r.stdout)["stats"]["n_drafted"] == 0


def test_a_hybrid_target_served_remotely_rolls_back_with_its_checkpoints(two_servers, qwen35_mtp_path):
    prompt = "one two three one two three one two"
    local = generate(qwen35_mtp_path, prompt=prompt, n=24, spec="draft-mtp")
    remote = generate(qwen35_mtp_path, "--rpc", ",".join(two_servers), "-ngl", "99", prompt=prompt, n=24,
                      spec="draft-mtp")
    same_run(local, remote)
    assert remote["stats"]["n_drafted"] > 0


def _runner_reply(opts, spec: str, prompt: str, **kw) -> tuple[list[int], dict]:
    """One reply from a chat runner: its tokens and draft counts."""
    from app.runner import RunnerEngine
    from speculators.events import FinishEvent
    from speculators.params import SpecParams
    from speculators.sampling import SamplingParams
    eng = RunnerEngine(opts, SpecParams.from_types(spec))
    try:
        eng.set_spec(SpecParams.from_types(spec))
        toks = eng.prompt_tokens(text=prompt, raw=True)
        fin = [ev for ev in eng.generate(toks, sampling=SamplingParams(temperature=0.0), **kw)
               if isinstance(ev, FinishEvent)][-1]
        st = fin.result.stats
        return fin.result.tokens, {"n_drafted": st.n_drafted, "n_accepted": st.n_accepted}
    finally:
        eng.close()


def test_the_chats_context_shift_with_the_target_remote(two_servers, f16_model_path):
    from app.options import ModelOptions
    kw = dict(max_tokens=120, context_shift=True, n_keep=1)
    local = ModelOptions(model=str(f16_model_path), ctx_size=96, threads=1)
    remote = ModelOptions(model=str(f16_model_path), ctx_size=96, threads=1, rpc=two_servers[0], n_gpu_layers=99)
    a = _runner_reply(local, "ngram-mod", REPEAT, **kw)
    b = _runner_reply(remote, "ngram-mod", REPEAT, **kw)
    assert len(a[0]) == 120            # past the context's end (96 cells, ~30 of them the prompt): it shifted
    assert a == b


# -- errors ---------------------------------------------------------------------------------

def test_generate_with_an_unreachable_server_is_one_clear_line(f16_model_path):
    r = generate(f16_model_path, "--rpc", f"127.0.0.1:{free_port()}", check=False)
    assert r.returncode == 1
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert lines[-1].startswith("draftlight: error: cannot reach RPC server 127.0.0.1:"), r.stderr
    assert "Connection refused" in lines[-1] and "rpc-server" in lines[-1]


def test_an_unknown_device_lists_the_ones_there_are(two_servers, f16_model_path):
    r = generate(f16_model_path, "--rpc", two_servers[0], "-dev", "CUDA7", check=False)
    assert r.returncode == 1
    assert "unknown device 'CUDA7': the devices are RPC0" in r.stderr


def test_a_server_killed_mid_reply_is_a_clear_error_and_the_chat_goes_on(tmp_path, f16_model_path):
    from app.options import ModelOptions
    from app.runner import RunnerCrashed, RunnerEngine
    from speculators.events import StepEvent
    from speculators.params import SpecParams
    from speculators.sampling import SamplingParams

    server = RpcServer()
    try:
        opts = ModelOptions(model=str(f16_model_path), ctx_size=1024, threads=1, rpc=server.endpoint,
                            n_gpu_layers=99)
        eng = RunnerEngine(opts, SpecParams(), lookup_root=tmp_path / "lookup")
        assert eng.load_warnings == []
        prompt = eng.prompt_tokens(text="Count from 1 to 100, separated by commas.")
        steps = 0
        with pytest.raises(RunnerCrashed) as info:
            for ev in eng.generate(prompt, max_tokens=400, sampling=SamplingParams(temperature=0.0)):
                if isinstance(ev, StepEvent):
                    steps += 1
                    if steps == 5:
                        server.proc.send_signal(signal.SIGKILL)
        msg = str(info.value)
        assert "RPC server (--rpc) stopped answering" in msg and "rpc-server" in msg, msg
        assert steps >= 5
        # the next request: a fresh runner, which leaves the gone server out and runs locally
        deadline = time.monotonic() + 120
        while not eng.alive and time.monotonic() < deadline:
            time.sleep(0.2)
        out = [ev for ev in eng.generate(prompt, max_tokens=8, sampling=SamplingParams(temperature=0.0))
               if isinstance(ev, StepEvent)]
        assert out, "no reply after the server went away"
        assert any("cannot reach RPC server" in w and "this machine's devices" in w for w in eng.load_warnings), \
            eng.load_warnings
        eng.close()
    finally:
        server.stop()


# -- the chat, for real, under tmux ------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_the_chat_over_rpc_colours_drafts_survives_the_server_going_away_and_goes_on(tmp_path, f16_model_path):
    """The real app: a reply with its layers on an rpc-server, coloured as ever; the server killed in
    the middle of the next reply ends it with the reason; the message after that is answered locally."""
    from .test_ui_e2e_tmux import COPY_PROMPT, COUNT_PROMPT, Tmux, _args
    server = RpcServer()
    t = Tmux(tmp_path)
    try:
        # 300 tokens: the count streams for seconds after "13, 14, 15", and the answer to "Say
        # hello." after it (which may run on to the limit) is held to it
        t.start(_args(f16_model_path, "-n", "300", "--rpc", server.endpoint, "-ngl", "99", "-t", "1"),
                tmp_path / "pid")
        t.wait_for(r"ready\s*$", timeout=120)
        t.keys(COPY_PROMPT, literal=True)
        t.keys("Enter")
        screen = t.wait_reply_done(timeout=180)
        assert "by ngram-mod" in screen, screen
        t.keys(COUNT_PROMPT, literal=True)
        t.keys("Enter")
        t.wait_for(r"13, 14, 15", timeout=120)          # the count is streaming
        server.proc.send_signal(signal.SIGKILL)
        screen = t.wait_for(r"stopped answering", timeout=120)
        assert "RPC server (--rpc) stopped answering" in " ".join(screen.replace("▌", " ").split()), screen
        assert "13, 14, 15" in screen                      # the partial reply stays
        t.keys("Say hello.", literal=True)
        t.keys("Enter")
        deadline = time.monotonic() + 180

        def answered() -> bool:
            """The saved chat ends with "Say hello." and a finished reply to it (the reply may be
            long enough to scroll the message off the screen: the store is read, not the screen)."""
            from app.storage import History
            h = History()
            try:
                chats = h.list_chats()
                msgs = h.load_chat(chats[0].id).messages if chats else []
            finally:
                h.close()
            return (len(msgs) >= 2 and msgs[-2].role == "user" and msgs[-2].content == "Say hello."
                    and msgs[-1].role == "assistant" and msgs[-1].status == "done")

        while True:        # the reply to the new message is done, and the chat ready again
            screen = t.screen()
            if re.search(r"ready\s*$", screen, re.M) and answered():
                break
            assert time.monotonic() < deadline, screen
            time.sleep(0.3)
        t.keys("C-q")
        t.wait_for(r"DRAFTLIGHT-EXIT=0", timeout=30)
    finally:
        t.close()
        server.stop()
