"""How the app words what it tells the person (no Textual).

May touch: nothing but its arguments.
"""

from __future__ import annotations


def sentence(text: str) -> str:
    """An error's line as a sentence: a capital first, a full stop last.

    >>> sentence("the disk is full")
    'The disk is full.'
    >>> sentence("Saved!")
    'Saved!'
    """
    text = text.strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")
