"""``draftlight serve --lookup-learn``: the ngram-cache's dynamic cache learns served conversations
(issue 52, "one model, shared"), so a conversation served again is drafted from what was learned;
without the switch the caches are only read, as llama-server reads ``-lcd``."""

from __future__ import annotations

import json
import urllib.request

import pytest

from app.cmd_serve import _learner
from app.options import ModelOptions
from app.runner import RunnerEngine
from app.serve import start_server
from speculators.params import SpecParams

def story(i: int, name: str) -> str:
    """Prompts whose greedy replies repeat nothing of them (fresh prose on the default model:
    nothing to draft from the context, as the read-only run shows); Mia's and Ola's replies begin
    with the same story, Ben's is another."""
    return f"Story {i}, for {name}.\n\nOnce upon a time, in a small village by the sea, there lived"


def completion(handle, prompt: str) -> dict:
    body = json.dumps({"prompt": prompt, "n_predict": 48, "temperature": 0, "cache_prompt": False}).encode()
    req = urllib.request.Request(handle.url + "/completion", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.load(r)


def from_cache(answer: dict) -> int:
    return answer["draftlight"]["drafted_by"].get("ngram-cache", 0)


@pytest.mark.parametrize("learn", [True, False], ids=["learning", "read-only"])
def test_a_served_conversation_teaches_the_dynamic_cache_only_with_the_switch(default_model_path, tmp_path, learn):
    spec = SpecParams.from_types("ngram-cache")
    engine = RunnerEngine(ModelOptions(model=str(default_model_path), ctx_size=1024, threads=2), spec)
    try:
        store, warnings = engine.open_store(spec, tmp_path / "lookup")
        assert store is not None and not warnings
        engine.set_spec(spec, resources=store.resources())
        handle = start_server(engine, "127.0.0.1", 0, learn=_learner(store) if learn else None)
        try:
            mia, ben, ola = (completion(handle, story(i, n)) for i, n in enumerate(("Mia", "Ben", "Ola"), 1))
            worker = handle.worker
        finally:
            handle.close()
        assert ola["content"][:40] == mia["content"][:40] != ben["content"][:40]     # (the premise)
        assert from_cache(mia) == 0                 # a fresh story, an empty cache: nothing to draft
        dynamic = store.info()["dynamic"]
        if learn:
            assert worker.learned == 3 and worker.learn_error is None
            # learned and saved: the dynamic cache's file holds the conversations
            assert dynamic.exists and dynamic.file_bytes > 0 and dynamic.entries > 0
            # Ola's story is drafted from what Mia's taught the cache
            assert from_cache(ola) >= 8, ola["draftlight"]
        else:
            assert worker.learned == 0
            assert not dynamic.exists and dynamic.entries == 0
            assert from_cache(ola) == 0
        store.close()
    finally:
        engine.close()
