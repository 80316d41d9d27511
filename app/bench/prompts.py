"""``bench``'s prompts: read from ``--prompt`` and ``--prompt-file`` (parts separated by lines
of ``---``), and tokenized so that each leaves room for the reply in the context."""

from __future__ import annotations


def read_prompts(texts: list[str], files: list[str]) -> list[str]:
    """The non-blank ``texts``, then the non-blank parts of each file of ``files``."""
    prompts = [p for p in texts if p.strip()]
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        parts = [part.strip("\n") for part in _split(text)]
        prompts.extend(p for p in parts if p.strip())
    return prompts


def _split(text: str) -> list[str]:
    """``text`` cut at every line that is only ``---``."""
    parts, cur = [], []
    for line in text.splitlines():
        if line.strip() == "---":
            parts.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    parts.append("\n".join(cur))
    return parts


def tokenize_prompts(engine, texts: list[str], raw: bool, max_tokens: int,
                     what: str = "a prompt") -> list[list[int]]:
    """``texts`` as the engine's prompts (plain with ``raw``, else through the chat template);
    a :class:`~app.cli.CliError` naming ``what`` when one leaves no room for ``max_tokens``."""
    from ..cli import CliError
    prompts = [engine.prompt_tokens(text=t, raw=True) if raw else engine.prompt_tokens(text=t) for t in texts]
    too_long = [len(p) for p in prompts if len(p) + max_tokens >= engine.ctx.n_ctx]
    if too_long:
        raise CliError(f"{what} of {too_long[0]} tokens plus {max_tokens} to generate "
                       f"does not fit the context of {engine.ctx.n_ctx}; raise -c")
    return prompts
