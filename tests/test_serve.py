"""``draftlight serve`` (app.serve) against the official ``openai`` client and llama.cpp's
``/completion``, on the real default model in a runner process: one server for the module,
on 127.0.0.1 and a free port, with ngram-simple speculation."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from app.options import ModelOptions  # noqa: E402
from app.runner import RunnerEngine  # noqa: E402
from app.serve import start_server  # noqa: E402
from speculators.params import SpecParams  # noqa: E402
from speculators.sampling import SamplingParams  # noqa: E402

pytestmark = pytest.mark.slow

#: a text that repeats: ngram-simple finds its 12-token key in it and drafts the copy
PARA = ("The quick brown fox jumps over the lazy dog near the river bank, and then it runs into the "
        "forest to find its friends. ")
REPEAT = PARA * 3 + "The quick brown fox"
COPY = [{"role": "user", "content": "Repeat this list exactly: apples, pears, plums, cherries."}]


def serving(model, spec: SpecParams, n_ctx: int, **kw):
    """A runner on ``model`` with ``spec``, served on a free loopback port: yields (engine, handle)."""
    engine = RunnerEngine(ModelOptions(model=str(model), ctx_size=n_ctx, threads=2), spec)
    try:
        engine.set_spec(spec)
        handle = start_server(engine, "127.0.0.1", 0, **kw)
        try:
            yield engine, handle
        finally:
            handle.close()
    finally:
        engine.close()


@pytest.fixture(scope="module")
def served(default_model_path):
    yield from serving(default_model_path, SpecParams.from_types("ngram-simple"), 1024)


@pytest.fixture
def client(served):
    _, handle = served
    return openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def post(handle, path: str, body: dict) -> dict:
    req = urllib.request.Request(handle.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def test_chat_completion_through_the_transcript_with_usage_and_timings(served, client):
    engine, handle = served
    r = client.chat.completions.create(model="any", messages=COPY, max_tokens=12, temperature=0)
    text = r.choices[0].message.content
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert text and text == text.lstrip()
    assert r.choices[0].finish_reason in ("stop", "length")
    # the prompt is the chat's: the messages through the runner's prompt_tokens
    assert r.usage.prompt_tokens == len(engine.prompt_tokens(messages=COPY))
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    extra = r.model_extra
    assert extra["timings"]["predicted_n"] == r.usage.completion_tokens
    assert extra["timings"]["prompt_n"] + extra["timings"]["cache_n"] == r.usage.prompt_tokens
    assert "".join(t for t, _ in extra["draftlight"]["tokens"]) == text
    assert extra["draftlight"]["speculators"] == ["ngram-simple"]


def test_a_stream_is_the_same_reply_in_chunks_then_the_usage(served, client):
    kw = dict(model="any", messages=[{"role": "user", "content": "Name three colours."}], max_tokens=6,
              temperature=0)
    client.chat.completions.create(**kw)                     # the context as both runs below find it
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    whole = client.chat.completions.create(**kw)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    # the same prompt again: all of it but its last token comes from the context
    assert last.usage.prompt_tokens_details.cached_tokens == last.usage.prompt_tokens - 1
    assert all(c.usage is None for c in chunks[:-1])
    assert "timings" in last.model_extra and "draftlight" in last.model_extra
    # each chunk names who drafted its tokens
    pairs = [p for c in chunks if c.choices and c.choices[0].delta.content
             for p in c.model_extra["draftlight"]["tokens"]]
    assert "".join(t for t, _ in pairs) == text


def test_completions_models_and_health(served, client):
    engine, handle = served
    kw = dict(model="any", prompt="The capital of France is", max_tokens=4, temperature=0)
    client.completions.create(**kw)                          # the context as both runs below find it
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    r = client.completions.create(**kw)
    assert r.object == "text_completion" and r.choices[0].text == streamed != ""
    assert r.usage.prompt_tokens == len(engine.prompt_tokens(text=kw["prompt"], raw=True))
    models = client.models.list().data
    assert [m.id for m in models] == [handle.model_id] == ["gemma-3-270m-q4_k_m.gguf"]
    assert models[0].model_extra["meta"]["n_ctx"] == 1024
    with urllib.request.urlopen(handle.url + "/health", timeout=30) as resp:
        assert json.load(resp) == {"status": "ok"}


def test_completion_reports_drafts_as_llama_server_and_who_drafted_them(served):
    _, handle = served
    d = post(handle, "/completion", {"prompt": REPEAT, "n_predict": 32, "temperature": 0})
    t = d["timings"]
    assert d["stop"] is True and d["stop_type"] == "limit" and d["tokens_predicted"] == t["predicted_n"] == 32
    assert t["draft_n"] > 0 and 0 < t["draft_n_accepted"] <= t["draft_n"]
    assert t["prompt_n"] + t["cache_n"] == d["tokens_evaluated"]
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0 and t["predicted_per_second"] > 0
    ext = d["draftlight"]
    assert set(ext["drafted_by"]) == {"ngram-simple"}
    assert sum(ext["drafted_by"].values()) + ext["accepted_past_end"] == t["draft_n_accepted"]
    assert sum(1 for _, by in ext["tokens"] if by) == sum(ext["drafted_by"].values())
    assert "".join(text for text, _ in ext["tokens"]) == d["content"]
    assert d["content"].startswith(" jumps over the lazy dog")
    # streamed: the pieces, then one last event with the timings (no [DONE], as llama.cpp's)
    req = urllib.request.Request(handle.url + "/completion", data=json.dumps(
        {"prompt": REPEAT, "n_predict": 32, "temperature": 0, "stream": True}).encode())
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: ")]
    assert [e["stop"] for e in events][-1] is True and not any(e["stop"] for e in events[:-1])
    assert "".join(e["content"] for e in events) == d["content"]
    assert events[-1]["timings"]["draft_n_accepted"] == sum(events[-1]["draftlight"]["drafted_by"].values()) \
        + events[-1]["draftlight"]["accepted_past_end"]


def test_greedy_output_is_the_engines_own(served):
    """The server writes what the engine writes in this process for the same prompt (the runs
    compared start from the same context: the prompt's last token read again)."""
    engine, handle = served
    body = {"prompt": "Once upon a time, in a small village,", "n_predict": 12, "temperature": 0}
    post(handle, "/completion", body)
    mine = engine.run(engine.prompt_tokens(text=body["prompt"], raw=True), max_tokens=12,
                      sampling=SamplingParams(temperature=0))
    served_ = post(handle, "/completion", dict(body, return_tokens=True))
    assert served_["content"] == mine.text and served_["tokens"] == mine.tokens
    # a seed makes a sampled reply repeatable too (from the same context as well: the same prompt)
    body = dict(body, n_predict=8, temperature=0.9, seed=1234)
    assert post(handle, "/completion", body)["content"] == post(handle, "/completion", body)["content"]


def test_the_next_turn_reuses_the_conversation_in_the_context(served, client):
    engine, _ = served
    first = client.chat.completions.create(model="any", messages=COPY, max_tokens=16, temperature=0)
    n_first = first.usage.prompt_tokens
    turn = COPY + [{"role": "assistant", "content": first.choices[0].message.content},
                   {"role": "user", "content": "Thanks. How many fruits is that?"}]
    second = client.chat.completions.create(model="any", messages=turn, max_tokens=8, temperature=0)
    assert second.usage.prompt_tokens == len(engine.prompt_tokens(messages=turn)) > n_first
    assert second.usage.prompt_tokens_details.cached_tokens >= n_first
    assert second.model_extra["timings"]["prompt_n"] == \
        second.usage.prompt_tokens - second.usage.prompt_tokens_details.cached_tokens


def _send(handle, body: dict) -> socket.socket:
    """A raw connection that sent a request (closing it is a client that goes away)."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", handle.port), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def _open_stream(handle, body: dict) -> socket.socket:
    """A raw connection reading a stream."""
    s = _send(handle, body)
    got = b""
    while got.count(b"data: ") < 3:
        chunk = s.recv(65536)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 200")
    return s


def test_a_client_that_disconnects_stops_its_generation(served, client):
    _, handle = served
    s = _open_stream(handle, {"prompt": REPEAT, "max_tokens": 800, "temperature": 0, "stream": True})
    s.close()
    t0 = time.monotonic()
    r = client.completions.create(model="any", prompt="Hello", max_tokens=3, temperature=0)
    took = time.monotonic() - t0
    assert r.choices[0].text is not None
    gone = [rec for rec in handle.finished if rec.endpoint == "/v1/completions" and rec.n_prompt > 50][-1]
    assert gone.finish_reason == "cancelled" and gone.n_tokens < 400, gone
    assert took < 15, f"the next request waited {took:.1f} s"


def test_a_client_that_leaves_before_the_answer_or_its_turn_stops_its_request(served, client):
    """Without a stream: one client waits for its whole answer, another queues behind it; both
    leave. Neither generates any further, and the next request starts at once."""
    _, handle = served
    body = {"prompt": REPEAT, "max_tokens": 800, "temperature": 0}
    n_before = len(handle.finished)
    first = _send(handle, body)
    t_end = time.monotonic() + 60
    while not handle.worker.busy and time.monotonic() < t_end:
        time.sleep(0.02)
    queued = _send(handle, body)
    while handle.worker.pending < 2 and time.monotonic() < t_end:
        time.sleep(0.02)
    time.sleep(0.5)
    queued.close()
    first.close()
    t0 = time.monotonic()
    client.completions.create(model="any", prompt="Hello", max_tokens=2, temperature=0)
    took = time.monotonic() - t0
    records = list(handle.finished)[n_before:]
    assert [r.finish_reason for r in records[:2]] == ["cancelled", "gone"], records
    assert records[0].n_tokens < 400 and took < 15


#: ``draftlight serve`` as the command runs it (app.cmd_serve: its flags, its output, its stop)
COMMAND = ("import argparse, sys; from app import cmd_serve; p = argparse.ArgumentParser(); "
           "cmd_serve.add_arguments(p); sys.exit(cmd_serve.run(p.parse_args(sys.argv[1:])))")


def test_the_serve_command_serves_until_it_is_stopped(default_model_path, tmp_path):
    import os
    import re
    import signal
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", COMMAND, "--model", str(default_model_path), "--port", "0",
                             "-c", "512", "-t", "2", "--spec-type", "ngram-mod", "--no-config", "--alias", "tiny"],
                            cwd=root, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"on (http://127\.0\.0\.1:\d+) ", line)
            if m:
                url = m.group(1)
                break
        else:
            pytest.fail("".join(lines))
        assert "speculation: ngram-mod" in lines[-1]
        c = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in c.models.list().data] == ["tiny"]
        r = c.completions.create(model="tiny", prompt="Hello", max_tokens=2, temperature=0)
        assert r.usage.completion_tokens >= 1
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[1]
        assert proc.returncode == 0, rest
        assert "/v1/completions: " in rest and "stopping" in rest     # a line per request, then the end
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
