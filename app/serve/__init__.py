"""``draftlight serve``: the loaded model over HTTP, as llama.cpp's ``llama-server`` serves it.

Endpoints: OpenAI's ``POST /v1/chat/completions`` (the messages go through the
model's chat template, or the plain transcript of a model without one, exactly as
the chat renders them: the runner's ``prompt_tokens(messages=...)``, and the
transcript's stop strings end the reply as in the chat), ``POST /v1/completions``
(a raw prompt) and ``GET /v1/models``; llama.cpp's ``POST /completion`` and
``GET /health``. Each answers whole or, with ``"stream": true``, as server-sent
events; ``max_tokens`` (``n_predict`` for ``/completion``), ``temperature``,
``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop`` and
``stream_options.include_usage`` are honoured.

Every answer reports the speculation as llama-server does (``usage`` with
``prompt_tokens_details.cached_tokens``, and ``timings`` with ``draft_n`` and
``draft_n_accepted``) and adds a ``draftlight`` object that names the speculator
that drafted each accepted token (:mod:`app.serve.responses`).

Requests, in the order they arrive, take turns on the one engine (an asyncio lock,
as ``llama-server -np 1``); the engine runs in a worker thread and hands its
events to the event loop through a queue (:mod:`app.serve.worker`). A client that
disconnects stops its generation, and the next request starts at once. A request
whose prompt extends the last one's prompt and reply (the next turn of a chat)
reuses the context's prefix: only the new tokens are read (``cached_tokens``).
The server never reads a prompt ahead of a request or between requests, so
nothing but the next request touches the context.

Fields: **a field this server does not know is ignored** (llama-server takes
dozens of extra fields, and clients send them); a field it knows with a value of
the wrong type or out of range is a 400 that names it; a field it knows but does
not implement (``n`` above 1, ``logprobs``, ``tools``, the penalties,
``logit_bias``, ...) passes at its neutral value only and is a 400 otherwise,
since ignoring it would change the answer; ``null`` is the same as leaving a
field out. Bad JSON is a 400, a body over 8 MiB a 413, a prompt the context cannot
hold a 400 that says how many tokens it has and the context's size
(``exceed_context_size_error``). Errors are OpenAI's JSON (:mod:`app.serve.errors`).

A crash of the model runner in the middle of a request is a 500 (or, in a stream
that has begun, an error event that ends it); :class:`~app.runner.RunnerEngine`
starts a fresh runner, and the next request is answered by it.

Safe by default: it listens on 127.0.0.1. Any other address needs an API key
(``--api-key KEY``; clients send ``Authorization: Bearer KEY``), else it refuses
to start, and with one it prints a warning (plain HTTP). Without a key, a
loopback server refuses requests that name another host or come from a web page
of another origin (a browser tricked into sending them, :mod:`app.serve.server`).
"""

from __future__ import annotations

from .errors import ApiError, ServeError
from .server import MAX_BODY_BYTES, ServerHandle, check_bind, is_loopback, make_app, start_server

__all__ = ["ApiError", "ServeError", "MAX_BODY_BYTES", "ServerHandle", "check_bind", "is_loopback", "make_app",
           "start_server"]
