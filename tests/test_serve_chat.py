"""The chat serves its own model (:mod:`app.session.serving`): the official ``openai`` client is
answered by the chat's runner, a served request and a chat reply take turns on the one engine,
served requests are reported to the session (and counted in its statistics), and the chat's Esc
never stops a request it did not start. On the real default model, in a runner process."""

from __future__ import annotations

import queue
import socket
import threading
import time

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from app import session as sess  # noqa: E402
from app.ui.actions import STARTERS  # noqa: E402
from speculators.events import STOP_CANCELLED, STOP_EOG, STOP_LENGTH, STOP_STRING  # noqa: E402
from app.session import SessionError  # noqa: E402

from .test_runner import LONG, runner_session  # noqa: E402
from .test_session import drain  # noqa: E402

pytestmark = pytest.mark.slow

COPY = [{"role": "user", "content": "Repeat this list exactly: apples, pears, plums, cherries, grapes, lemons."}]
#: a passage the reply copies: ngram-simple drafts the copy
PASSAGE = [{"role": "user", "content": STARTERS[0].text}]


def client(s) -> "openai.OpenAI":
    return openai.OpenAI(base_url=s.serving_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def in_thread(fn, *args, **kw) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kw)
        except Exception as e:       # the test reads it
            out["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def settle(s, q: queue.Queue) -> list:
    """Apply the events already posted; returns them."""
    seen = []
    while True:
        try:
            ev = q.get_nowait()
        except queue.Empty:
            return seen
        s.apply(ev)
        seen.append(ev)


@pytest.fixture
def chat(tmp_path, default_model_path):
    s, q = runner_session(tmp_path, default_model_path, spec="ngram-simple", max_tokens=400)
    try:
        yield s, q
    finally:
        s.close()


def test_the_chat_serves_its_model_to_the_openai_client_and_reports_the_request(chat):
    s, q = chat
    assert s.start_serving(port=0) == []            # loopback: nothing to warn of
    events = settle(s, q)
    assert s.serving_url.startswith("http://127.0.0.1:")
    assert [e.url for e in events if isinstance(e, sess.ServeChanged)] == [s.serving_url]
    before = s.stats.totals.replies
    t, out = in_thread(client(s).chat.completions.create, model="x", messages=PASSAGE, max_tokens=48,
                       temperature=0)
    drain(s, q, lambda: not t.is_alive() and s.served and s.served[-1].done, timeout=120)
    assert "error" not in out, out
    r = out["value"]
    assert r.model == s.engine.model.path.rsplit("/", 1)[-1] == client(s).models.list().data[0].id
    req = s.served[-1]
    # the request as the session saw it: the same reply, token by token, with who drafted what
    assert req.endpoint == "/v1/chat/completions" and req.kind == "chat" and req.client == "127.0.0.1"
    assert req.messages == PASSAGE and STARTERS[0].copied in req.label
    # the engine's reason (the API says "stop" for an end of turn or a stop string)
    assert req.status == {"stop": req.status if req.status in (STOP_EOG, STOP_STRING) else "?",
                          "length": STOP_LENGTH}[r.choices[0].finish_reason]
    assert req.reply_text.strip() == r.choices[0].message.content
    assert req.n_prompt == r.usage.prompt_tokens
    # token by token, with who drafted each (the API's reply leaves out the space a chat reply begins
    # with; the request keeps the tokens as the engine wrote them)
    ours = [[t.text, t.drafted_by] for t in req.tokens]
    ours[0][0] = ours[0][0].lstrip()
    assert [p for p in ours if p[0]] == [p for p in r.model_extra["draftlight"]["tokens"] if p[0]]
    assert req.n_accepted == r.model_extra["timings"]["draft_n_accepted"]
    assert req.n_drafted == r.model_extra["timings"]["draft_n"]
    assert sum(req.by.values()) == req.n_accepted
    assert req.n_accepted > 0 and set(req.by) == {"ngram-simple"}
    # the tokens it shows coloured are those the API says a drafter supplied
    shown = sum(1 for tok in req.tokens if tok.drafted_by == "ngram-simple")
    assert shown > 0 and shown == r.model_extra["draftlight"]["drafted_by"]["ngram-simple"]
    # F4's figures count it as a reply of the session
    assert s.stats.totals.replies == before + 1
    assert s.stats.totals.n_drafted == req.n_drafted and s.stats.speculators["ngram-simple"].n_acc_tokens == req.n_accepted


def test_a_served_request_waits_for_the_chats_reply_and_the_chats_esc_leaves_it_alone(chat):
    s, q = chat
    s.start_serving(port=0)
    reply = s.send(LONG)
    drain(s, q, lambda: len(reply.tokens) >= 3 or s.job is None, timeout=120)
    assert s.job is not None, "the chat's reply ended before the request was sent"
    t, out = in_thread(client(s).chat.completions.create, model="x", messages=[{"role": "user", "content": LONG}],
                       max_tokens=150, temperature=0)
    drain(s, q, lambda: bool(s.served), timeout=30)
    assert s.served[-1].status == "waiting" and s.job is not None      # its turn comes after the reply
    # the chat's reply ends (Esc); then the request generates, and a second Esc (the person's, for a
    # chat reply that waits) does not stop it
    s.stop()
    drain(s, q, lambda: s.job is None, timeout=60)
    assert reply.finish == STOP_CANCELLED
    drain(s, q, lambda: len(s.served[-1].tokens) >= 3, timeout=60)
    nxt = s.send("Say hello.")                      # waits for the request
    s.stop()                                        # Esc: stops the chat's reply, not the request
    drain(s, q, lambda: not t.is_alive() and s.served[-1].done and s.job is None, timeout=120)
    assert "error" not in out, out
    req = s.served[-1]
    assert req.status == STOP_LENGTH and len(req.tokens) == 150, (req.status, req.error)
    assert req.reply_text.strip() == out["value"].choices[0].message.content
    assert nxt.finish == STOP_CANCELLED


def test_a_client_that_leaves_while_it_waits_is_not_served_and_the_next_is(chat):
    s, q = chat
    s.start_serving(port=0)
    reply = s.send(LONG)
    drain(s, q, lambda: len(reply.tokens) >= 3 or s.job is None, timeout=120)
    assert s.job is not None
    impatient = openai.OpenAI(base_url=s.serving_url + "/v1", api_key="unused", max_retries=0, timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model="x", messages=COPY, max_tokens=40, temperature=0)
    drain(s, q, lambda: bool(s.served), timeout=30)
    assert s.job is not None and s.served[-1].status == "waiting"      # the chat's reply goes on
    s.stop()
    drain(s, q, lambda: s.job is None and s.served[-1].done, timeout=60)
    # nothing was generated for the client that left
    assert s.served[-1].status in ("gone", STOP_CANCELLED) and not s.served[-1].tokens
    r = client(s).chat.completions.create(model="x", messages=COPY, max_tokens=16, temperature=0)
    drain(s, q, lambda: len(s.served) == 2 and s.served[-1].done, timeout=30)
    assert r.choices[0].message.content and s.served[-1].status in (STOP_EOG, STOP_STRING, STOP_LENGTH)


def test_stopping_the_server_closes_its_port_and_the_bind_rules_hold(chat):
    s, q = chat
    with pytest.raises(SessionError, match="API key"):
        s.start_serving(host="0.0.0.0", port=0)
    assert s.serving_url is None
    s.start_serving(port=0)
    port = int(s.serving_url.rsplit(":", 1)[1])
    with pytest.raises(SessionError, match="already serving"):
        s.start_serving(port=0)
    # a port that is taken is said, and nothing else changes
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        other = sess.ChatSession(post=lambda ev: None, open_history=False, persist_config=False)
        with pytest.raises(SessionError, match="cannot listen"):
            other.start_serving(port=busy.getsockname()[1])
        assert other.serving_url is None
    settle(s, q)
    s.stop_serving()
    assert s.serving_url is None
    assert [e.url for e in settle(s, q) if isinstance(e, sess.ServeChanged)] == [None]
    deadline = time.time() + 5
    while time.time() < deadline:
        with socket.socket() as c:
            if c.connect_ex(("127.0.0.1", port)) != 0:
                break
        time.sleep(0.1)
    else:
        pytest.fail("the port still takes connections after stop_serving")
    # and the chat goes on
    reply = s.send("Say hello.")
    drain(s, q, lambda: s.job is None, timeout=120)
    assert reply.status == "done" and reply.text


def test_a_request_while_no_model_is_loaded_is_a_503_not_a_hang(tmp_path):
    q: queue.Queue = queue.Queue()
    s = sess.ChatSession(post=q.put, open_history=False, persist_config=False)
    try:
        s.start_serving(port=0)
        c = openai.OpenAI(base_url=s.serving_url + "/v1", api_key="unused", max_retries=0, timeout=10)
        with pytest.raises(openai.APIStatusError) as e:
            c.chat.completions.create(model="x", messages=COPY, max_tokens=4)
        assert e.value.status_code == 503 and "no model is loaded" in str(e.value)
    finally:
        s.close()
    assert s.serving_url is None


@pytest.mark.parametrize("learn", [True, False], ids=["learning", "read-only"])
def test_the_chats_lookup_caches_learn_served_conversations_only_when_asked(tmp_path, default_model_path, learn):
    """With ngram-cache, what one client was served drafts for the next, as the chat's replies do
    (``learn``); switched off, the caches are only read."""
    from .test_serve_learn import completion, from_cache, story
    s, q = runner_session(tmp_path, default_model_path, spec="ngram-cache", max_tokens=60)
    try:
        assert s.store is not None
        s.start_serving(port=0, learn=learn)
        handle = s.server
        mia, ben, ola = (completion(handle, story(i, n)) for i, n in enumerate(("Mia", "Ben", "Ola"), 1))
        drain(s, q, lambda: len(s.served) == 3 and all(r.done for r in s.served), timeout=60)
        assert ola["content"][:40] == mia["content"][:40] != ben["content"][:40]     # (the premise)
        assert from_cache(mia) == 0
        if learn:
            assert from_cache(ola) >= 8, ola["draftlight"]
            assert s.store.info()["dynamic"].entries > 0
            # the Server screen's figures name the cache as the drafter of Ola's tokens
            assert s.served[-1].by["ngram-cache"] >= 8
        else:
            assert from_cache(ola) == 0 and s.served[-1].by["ngram-cache"] == 0
    finally:
        s.close()


def test_stopping_the_server_mid_request_returns_at_once_and_stops_the_generation(chat):
    s, q = chat
    s.start_serving(port=0)
    t, out = in_thread(client(s).chat.completions.create, model="x", messages=[{"role": "user", "content": LONG}],
                       max_tokens=300, temperature=0)
    drain(s, q, lambda: bool(s.served) and len(s.served[-1].tokens) >= 3, timeout=60)
    t0 = time.perf_counter()
    s.stop_serving()
    assert time.perf_counter() - t0 < 0.5          # the UI thread never waits for the request
    t.join(30)
    assert not t.is_alive()
    drain(s, q, lambda: s.served[-1].done, timeout=30)
    req = s.served[-1]
    assert req.status == STOP_CANCELLED and 3 <= len(req.tokens) < 300     # its generation was stopped
    # and its client got the reply as far as it was written
    assert "error" not in out, out
    assert out["value"].choices[0].message.content.strip() == req.reply_text.strip()
    # the engine is free: the chat's next reply is written, and serving can start again at once
    reply = s.send("Say hello.")
    drain(s, q, lambda: s.job is None, timeout=120)
    assert reply.status == "done" and reply.text
    s.start_serving(port=0)
    assert client(s).models.list().data
