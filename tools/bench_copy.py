#!/usr/bin/env python3
"""How often the default model does what a copy request asks, at the chat's default settings.

    python tools/bench_copy.py [-m MODEL] [--seeds 3] [-n 160]

For each request of ``COPY_REQUESTS`` and ``HELD_OUT`` (repeat / quote / copy / rewrite-with-
the-same-words a text pasted into the message; the second set was written after the transcript's
worked exchanges were chosen on the first, to check they were not fitted to it) and each seed,
the chat's own prompt (its template, no system prompt, ``auto`` speculation, the app's default
sampling: temperature 0.8, top-k 40, top-p 0.95, min-p 0.2) is answered by the engine; a reply *copies* when it holds at least 80 % of the
pasted text's words in order, and *lights up* when drafts were accepted in it. Also prints,
for ``QUESTIONS`` (ordinary questions), how many replies are answers at all (not empty, not
the question said back) -- the check that copy-friendliness made nothing worse.
"""
from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

COPY_REQUESTS = [
    ("Repeat this list exactly: apples, pears, plums, cherries, grapes, lemons, limes, figs.",
     "apples, pears, plums, cherries, grapes, lemons, limes, figs."),
    ("Quote the following paragraph: The river rose in the night and by morning the low fields were "
     "under water. The farmers moved their animals to the hill and waited.",
     "The river rose in the night and by morning the low fields were under water. The farmers moved "
     "their animals to the hill and waited."),
    ("Copy this text exactly: Meeting moved to Thursday at ten. Bring the budget notes and the "
     "printed schedule.", "Meeting moved to Thursday at ten. Bring the budget notes and the printed schedule."),
    ("Repeat after me: the quick brown fox jumps over the lazy dog near the old stone bridge.",
     "the quick brown fox jumps over the lazy dog near the old stone bridge."),
    ("Please repeat this sentence word for word: Our office will be closed on Monday for the holiday.",
     "Our office will be closed on Monday for the holiday."),
    ("Copy the following code exactly:\ndef area(w, h):\n    return w * h\n\nprint(area(3, 4))",
     "def area(w, h):\n    return w * h\n\nprint(area(3, 4))"),
    ("Repeat this address: 14 Harbour Street, Flat 3, Leith, Edinburgh EH6 6JJ.",
     "14 Harbour Street, Flat 3, Leith, Edinburgh EH6 6JJ."),
    ("Quote this line back to me: All that glitters is not gold; often have you heard that told.",
     "All that glitters is not gold; often have you heard that told."),
    ("Write this out again exactly as it is: red, orange, yellow, green, blue, indigo, violet.",
     "red, orange, yellow, green, blue, indigo, violet."),
    ("Repeat the following text: Water boils at one hundred degrees at sea level and at lower "
     "temperatures higher up.", "Water boils at one hundred degrees at sea level and at lower temperatures higher up."),
]

HELD_OUT = [
    ("Repeat this sentence back to me: The library opens at nine and closes at five on weekdays.",
     "The library opens at nine and closes at five on weekdays."),
    ("Say this again, word for word: Turn left at the bakery, then take the second right after the church.",
     "Turn left at the bakery, then take the second right after the church."),
    ("Copy this list exactly: hammer, nails, saw, drill, screws, tape, glue.",
     "hammer, nails, saw, drill, screws, tape, glue."),
    ("Quote this paragraph exactly: The storm passed before dawn. By noon the streets were dry and the "
     "market was busy again.", "The storm passed before dawn. By noon the streets were dry and the market was "
     "busy again."),
    ("Please copy this code exactly:\nx = [1, 2, 3]\nfor n in x:\n    print(n * 2)",
     "x = [1, 2, 3]\nfor n in x:\n    print(n * 2)"),
    ("Repeat this message: Call Anna back before six, she needs the keys for the van.",
     "Call Anna back before six, she needs the keys for the van."),
    ("Repeat these words in the same order: window, river, candle, mountain, letter, garden.",
     "window, river, candle, mountain, letter, garden."),
    ("Rewrite this exactly as it is: The parcel arrived damaged, so we sent it back on Tuesday.",
     "The parcel arrived damaged, so we sent it back on Tuesday."),
    ("Quote this back to me word for word: Practice does not make perfect; perfect practice makes perfect.",
     "Practice does not make perfect; perfect practice makes perfect."),
    ("Repeat the following text: Slice the onions thinly, fry them slowly in butter, and add the stock "
     "when they are golden.", "Slice the onions thinly, fry them slowly in butter, and add the stock when "
     "they are golden."),
]

QUESTIONS = [
    "What is the capital of France?",
    "Why is the sky blue?",
    "Give me three tips for sleeping better.",
    "What does a bee do in winter?",
    "How do I boil an egg?",
    "Who wrote Romeo and Juliet?",
    "What is a noun?",
    "Name a fruit that is yellow.",
    "What do cows eat?",
]


def words(s: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", s.lower())


def copies(reply: str, text: str, need: float = 0.8) -> bool:
    """At least ``need`` of the text's words appear in the reply, in order."""
    a, b = words(text), words(reply)
    if not a:
        return False
    m = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return sum(bl.size for bl in m.get_matching_blocks()) / len(a) >= need


def measure(eng, copy_seeds, question_seeds, copy_tokens: int = 160, question_tokens: int = 160,
            temperature: float | None = None, verbose: bool = False, requests=None, min_p: float | None = None) -> dict:
    """Run the requests (``COPY_REQUESTS`` and ``HELD_OUT`` unless given) and questions on ``eng``
    (the chat's prompt, seeded, the app's default sampling); the counts: ``copied``, ``lit``
    (copied with accepted drafts), ``requests``, ``answered``, ``questions``."""
    import dataclasses

    from app.config import default_sampling

    def sampling(seed: int):
        s = dataclasses.replace(default_sampling(), seed=seed)
        if temperature is not None:
            s.temperature = temperature
        if min_p is not None:
            s.min_p = min_p
        return s

    def reply(text: str, seed: int, n: int):
        return eng.run(eng.prompt_tokens([{"role": "user", "content": text}]), max_tokens=n,
                       sampling=sampling(seed), stop=tuple(eng.template.stop_strings))

    out = dict.fromkeys(("copied", "lit", "requests", "answered", "questions"), 0)
    for req, text in (COPY_REQUESTS + HELD_OUT if requests is None else requests):
        for seed in copy_seeds:
            r = reply(req, seed, copy_tokens)
            ok, lit = copies(r.text, text), r.stats.n_accepted > 0
            out["requests"] += 1
            out["copied"] += ok
            out["lit"] += ok and lit
            if verbose:
                print(f"{'COPY' if ok else 'miss'} {'lit ' if lit else 'dark'} {req[:40]!r} -> {r.text[:80]!r}")
    for q in QUESTIONS:
        for seed in question_seeds:
            r = reply(q, seed, question_tokens)
            ans = len(words(r.text)) >= 1 and not copies(r.text, q, 0.9)
            out["questions"] += 1
            out["answered"] += ans
            if verbose:
                print(f"{'ans ' if ans else 'BAD '} {q!r} -> {r.text[:80]!r}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--temp", type=float, default=None, help="default: the chat's default temperature")
    ap.add_argument("--min-p", type=float, default=None, help="default: the chat's default min-p")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()

    from app.options import ModelOptions
    from app.runtime import open_engine
    from speculators.params import SpecParams

    eng = open_engine(ModelOptions(model=a.model, threads=a.threads), SpecParams.auto())
    seeds = range(1, a.seeds + 1)
    m = measure(eng, seeds, seeds, a.n, a.n, a.temp, a.verbose, min_p=a.min_p)
    eng.close()
    n_all, n_copy, n_lit, nq, n_ans = m["requests"], m["copied"], m["lit"], m["questions"], m["answered"]
    print(f"copy requests: {n_copy}/{n_all} copied ({100 * n_copy / n_all:.0f}%), "
          f"{n_lit}/{n_all} copied with accepted drafts ({100 * n_lit / n_all:.0f}%; target >= 80%)")
    print(f"ordinary questions: {n_ans}/{nq} answered ({100 * n_ans / nq:.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
