"""The server's errors, in OpenAI's shape (as llama-server words them).

Every error a client gets is one JSON object::

    {"error": {"message": "...", "type": "invalid_request_error", "code": 400, "param": "max_tokens"}}

``type`` and the numeric ``code`` are llama-server's (``format_error_response``:
``invalid_request_error`` 400, ``authentication_error`` 401, ``not_found_error``
404, ``server_error`` 500, ``unavailable_error`` 503, ``exceed_context_size_error``
400); ``param`` (OpenAI's) names the request field at fault, where one is. A
prompt longer than the context also carries llama-server's ``n_prompt_tokens``
and ``n_ctx``. In a stream that has begun, an error is one more event,
``data: {"error": {...}}``, and the stream ends there (no ``[DONE]``), as
llama-server sends it; the ``openai`` package raises ``APIError`` on it.

    >>> e = ApiError.invalid("must be at least 1", param="max_tokens")
    >>> e.status, e.body()
    (400, {'error': {'message': 'max_tokens: must be at least 1', 'type': 'invalid_request_error', 'code': 400, 'param': 'max_tokens'}})
"""

from __future__ import annotations

from typing import Any

#: error type -> HTTP status (llama-server's ``format_error_response``)
STATUS = {
    "invalid_request_error": 400,
    "exceed_context_size_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large_error": 413,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
}


class ApiError(Exception):
    """An error answered to the client (``status`` and :meth:`body`)."""

    def __init__(self, message: str, type_: str = "invalid_request_error", *, param: str | None = None,
                 status: int | None = None, extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.type = type_
        self.param = param
        self.status = status if status is not None else STATUS.get(type_, 500)
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"message": self.message, "type": self.type, "code": self.status}
        if self.param is not None:
            err["param"] = self.param
        err.update(self.extra)
        return {"error": err}

    # -- the usual ones ----------------------------------------------------------------------
    @classmethod
    def invalid(cls, message: str, param: str | None = None) -> "ApiError":
        """A bad request; with ``param``, the message starts with the field's name."""
        return cls(f"{param}: {message}" if param else message, "invalid_request_error", param=param)

    @classmethod
    def over_context(cls, n_prompt: int, n_ctx: int) -> "ApiError":
        """A prompt the context cannot hold (the engine needs one cell for the reply's first token).

        >>> ApiError.over_context(5000, 4096).message
        'the prompt has 5000 tokens but the context holds 4096 (the reply needs at least one more); shorten it or start the server with a larger --ctx-size'
        """
        return cls(f"the prompt has {n_prompt} tokens but the context holds {n_ctx} (the reply needs at least "
                   f"one more); shorten it or start the server with a larger --ctx-size",
                   "exceed_context_size_error", extra={"n_prompt_tokens": n_prompt, "n_ctx": n_ctx})

    @classmethod
    def server(cls, message: str) -> "ApiError":
        return cls(message, "server_error")

    @classmethod
    def unauthorized(cls) -> "ApiError":
        return cls("Invalid API Key", "authentication_error")

    @classmethod
    def not_found(cls, path: str) -> "ApiError":
        return cls(f"no such endpoint: {path}", "not_found_error")

    @classmethod
    def too_large(cls, limit: int) -> "ApiError":
        return cls(f"the request body is larger than the server's limit of {limit} bytes",
                   "request_too_large_error")


class ServeError(ValueError):
    """The server cannot start as asked (its message says why and what to do)."""
