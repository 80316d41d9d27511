"""``draftlight serve``'s refusals and failures: each kind of bad request, the API key, the
address it may listen on, and a model runner killed in the middle of a request. One server
for the module (an API key set, a 512-token context, no speculation)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import threading
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from app.serve import MAX_BODY_BYTES, ServeError, check_bind, start_server  # noqa: E402
from speculators.params import SpecParams  # noqa: E402

from .test_serve import serving  # noqa: E402

pytestmark = pytest.mark.slow

KEY = "test-key-5f2c"
N_CTX = 512
LONG = "The quick brown fox jumps over the lazy dog near the river bank. " * 12


@pytest.fixture(scope="module")
def served(default_model_path):
    yield from serving(default_model_path, SpecParams(), N_CTX, api_key=KEY)


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[1].url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def request(handle, method: str, path: str, body: bytes | dict | None = None, key: str | None = KEY,
            headers: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=120)
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    h.update(headers or {})
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    status, raw = r.status, r.read()
    conn.close()
    return status, json.loads(raw)


def error_of(status: int, body: dict, want_status: int, want_type: str = "invalid_request_error") -> dict:
    assert status == want_status, body
    err = body["error"]
    assert err["type"] == want_type and err["code"] == want_status and err["message"], body
    return err


CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Hi"}]


def test_bad_json_is_a_400(served):
    _, h = served
    error_of(*request(h, "POST", CHAT, b'{"messages": [ '), 400)
    error_of(*request(h, "POST", CHAT, b'[1, 2]'), 400)
    err = error_of(*request(h, "POST", "/completion", b'{"prompt": "x", "temperature": NaN}'), 400)
    assert "NaN" in err["message"]


@pytest.mark.parametrize("path,body,param", [
    (CHAT, {"messages": HI, "max_tokens": "8"}, "max_tokens"),
    (CHAT, {"messages": HI, "temperature": "hot"}, "temperature"),
    (CHAT, {"messages": HI, "stream": "yes"}, "stream"),
    (CHAT, {"messages": HI, "stop": [1, 2]}, "stop"),
    (CHAT, {"messages": HI, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    (CHAT, {"messages": "Hi"}, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (CHAT, {"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role"),
    (CHAT, {"messages": HI, "top_p": 1.5}, "top_p"),
    (CHAT, {"messages": HI, "seed": 2 ** 40}, "seed"),
    (CHAT, {"messages": HI, "n": 2}, "n"),
    (CHAT, {"messages": HI, "logprobs": True}, "logprobs"),
    ("/v1/completions", {"prompt": 42}, "prompt"),
    ("/v1/completions", {"prompt": ["one", "two"]}, "prompt"),
    ("/completion", {"prompt": "x", "n_predict": 1.5}, "n_predict"),
    ("/completion", {"prompt": [1, 2, 10 ** 9]}, "prompt"),
])
def test_a_known_field_of_the_wrong_type_or_range_is_a_400_naming_it(served, path, body, param):
    _, h = served
    err = error_of(*request(h, "POST", path, body), 400)
    assert err["param"] == param and err["message"].startswith(param)


def test_unknown_fields_are_ignored(served):
    _, h = served
    status, body = request(h, "POST", CHAT, {"messages": HI, "max_tokens": 2, "temperature": 0, "mirostat": 2,
                                             "cache_prompt": True, "x_vendor": {"a": [1]}, "user": "u1"})
    assert status == 200 and body["choices"][0]["message"]["role"] == "assistant"


def test_max_tokens_below_one_and_missing_messages_are_400s(served):
    _, h = served
    for field in ("max_tokens", "max_completion_tokens"):
        err = error_of(*request(h, "POST", CHAT, {"messages": HI, field: 0}), 400)
        assert err["param"] == field and "at least 1" in err["message"]
    err = error_of(*request(h, "POST", "/completion", {"prompt": "x", "n_predict": 0}), 400)
    assert err["param"] == "n_predict" and "-1 for no limit" in err["message"]
    err = error_of(*request(h, "POST", CHAT, {"max_tokens": 4}), 400)
    assert err["param"] == "messages" and "required" in err["message"]
    assert error_of(*request(h, "POST", CHAT, {"messages": []}), 400)["param"] == "messages"
    assert error_of(*request(h, "POST", "/v1/completions", {"max_tokens": 4}), 400)["param"] == "prompt"


def test_a_body_over_the_limit_is_a_413_before_it_is_read(served):
    _, h = served
    conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=60)
    conn.putrequest("POST", CHAT)
    conn.putheader("Authorization", f"Bearer {KEY}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))
    conn.endheaders()                     # no body: the size alone is refused
    r = conn.getresponse()
    err = error_of(r.status, json.loads(r.read()), 413, "request_too_large_error")
    assert str(MAX_BODY_BYTES) in err["message"]
    conn.close()
    assert MAX_BODY_BYTES == 8 << 20


def test_a_prompt_longer_than_the_context_says_both_sizes(served, client):
    engine, h = served
    n = len(engine.prompt_tokens(text=LONG * 4, raw=True))
    assert n > N_CTX
    err = error_of(*request(h, "POST", "/v1/completions", {"prompt": LONG * 4, "max_tokens": 4}), 400,
                   "exceed_context_size_error")
    assert err["n_prompt_tokens"] == n and err["n_ctx"] == N_CTX
    assert f"{n} tokens" in err["message"] and str(N_CTX) in err["message"]
    with pytest.raises(openai.BadRequestError, match=f"{N_CTX}"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": LONG * 4}], max_tokens=4)


def test_the_api_key_is_checked_except_for_health(served):
    _, h = served
    for key in (None, "wrong", ""):
        err = error_of(*request(h, "GET", "/v1/models", key=key), 401, "authentication_error")
        assert err["message"] == "Invalid API Key"
    error_of(*request(h, "POST", CHAT, {"messages": HI}, key="wrong"), 401, "authentication_error")
    status, body = request(h, "GET", "/v1/models", key=None, headers={"X-Api-Key": KEY})
    assert status == 200 and body["data"]
    assert request(h, "GET", "/health", key=None) == (200, {"status": "ok"})
    bad = openai.OpenAI(base_url=h.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_another_address_needs_an_api_key(served):
    engine, _ = served
    with pytest.raises(ServeError, match="--api-key"):
        start_server(engine, "0.0.0.0", 0)
    assert check_bind("::1", None) == [] and check_bind("localhost", None) == []
    warnings = check_bind("192.168.1.20", "k")
    assert warnings and "not encrypted" in warnings[0]
    # the command refuses before it loads anything
    from app import cmd_serve
    from app.cli import CliError
    p = argparse.ArgumentParser()
    cmd_serve.add_arguments(p)
    with pytest.raises(CliError, match="--api-key"):
        cmd_serve.run(p.parse_args(["--host", "0.0.0.0", "--port", "0", "--model", "/nonexistent.gguf"]))


def test_a_loopback_server_without_a_key_refuses_other_hosts_and_web_pages(served):
    engine, _ = served
    with start_server(engine, "127.0.0.1", 0) as open_:
        assert request(open_, "GET", "/v1/models", key=None)[0] == 200
        err = error_of(*request(open_, "GET", "/v1/models", key=None, headers={"Host": "evil.example:8080"}),
                       403, "permission_error")
        assert "evil.example" in err["message"]
        error_of(*request(open_, "POST", CHAT, {"messages": HI}, key=None,
                          headers={"Origin": "https://evil.example"}), 403, "permission_error")
        assert request(open_, "GET", "/v1/models", key=None, headers={"Origin": "http://localhost:3000"})[0] == 200
        error_of(*request(open_, "GET", "/v2/nothing", key=None), 404, "not_found_error")


def _kill_when_generating(engine, handle, after_s: float) -> threading.Thread:
    def kill() -> None:
        t_end = time.monotonic() + 60
        while not handle.worker.busy and time.monotonic() < t_end:
            time.sleep(0.02)
        time.sleep(after_s)
        os.kill(engine.pid, signal.SIGKILL)
    t = threading.Thread(target=kill, daemon=True)
    t.start()
    return t


def test_a_runner_killed_mid_request_is_a_500_and_the_next_request_is_answered(served, client):
    engine, h = served
    pid = engine.pid
    killer = _kill_when_generating(engine, h, 0.5)
    status, body = request(h, "POST", "/v1/completions", {"prompt": LONG, "max_tokens": 300, "temperature": 0})
    killer.join()
    err = error_of(status, body, 500, "server_error")
    assert "SIGKILL" in err["message"]
    r = client.completions.create(model="m", prompt="Hello there", max_tokens=3, temperature=0)
    assert r.usage.completion_tokens >= 1 and engine.pid != pid


def test_a_runner_killed_mid_stream_ends_it_with_an_error_event(served, client):
    engine, h = served
    pid = engine.pid
    got = []
    with pytest.raises(openai.APIError, match="SIGKILL") as info:
        for chunk in client.completions.create(model="m", prompt=LONG, max_tokens=300, temperature=0,
                                               stream=True):
            got.append(chunk)
            if len(got) == 2:
                os.kill(engine.pid, signal.SIGKILL)
    assert len(got) >= 2 and info.value.body["type"] == "server_error"
    r = client.chat.completions.create(model="m", messages=HI, max_tokens=3, temperature=0)
    assert r.choices[0].message.content is not None and engine.pid != pid
