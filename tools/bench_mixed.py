#!/usr/bin/env python3
"""Automatic against every fixed type on a mixed chat: pasted text, quotes and edits of it, beside
fresh questions.

    python tools/bench_mixed.py [-m MODEL] [-n 160] [--rounds 3] [-t 2] [--spec-type T ...]
                                [--chat tuned|recipe-email|class-shopping]

Plays the same multi-turn conversation (``TURNS``, or with ``--chat`` one of the held-out
``HELD_OUT``) once per configuration and round, the way
the chat does: the whole conversation rendered with the model's template every turn, one
speculator chain for the whole conversation (so the lookup drafters learn from earlier turns),
greedy replies of at most ``-n`` tokens. So that every configuration answers the same prompts,
the conversation's history holds ``none``'s replies (played first); each configuration's own
reply to a turn is what is timed -- or, with ``--same-text``, ``none``'s reply written by it
(teacher-forced, as ``draftlight bench --same-text``), so that a near-tie flipped on quantized
weights does not make two configurations time different replies. Configurations run interleaved, round by round. Prints per
configuration the tokens/s over the whole conversation (the fastest round, and the median), the
ratio to ``none``, whether its replies equal ``none``'s, and ``auto`` over the fastest fixed
type (the issue's stretch target: 1.15).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STORY = ("The lighthouse keeper climbed the hundred and twelve steps every evening at dusk. He carried a "
         "can of oil, a cloth, and a small notebook in which he wrote the weather, the ships he saw, and "
         "the colour of the sea. In winter the wind pressed against the glass so hard that the whole "
         "tower seemed to hum, and in summer the gulls nested on the gallery rail.")
CODE = ("def average(values):\n    total = 0\n    for v in values:\n        total += v\n"
        "    return total / len(values)\n")

#: the person's messages, in order
TURNS = [
    f"Here is a paragraph from my story:\n\n{STORY}\n\nSummarize it in one sentence.",
    "Quote the first sentence of my paragraph exactly.",
    "What is the capital of France?",
    f"This function crashes on an empty list:\n\n{CODE}\nRewrite it so that it returns 0 for an empty list.",
    "Repeat my paragraph exactly, but write 'windmill' instead of 'lighthouse'.",
    "Name three colours of the rainbow.",
    "Copy the original function exactly as I wrote it.",
    "What did the keeper carry? Answer in a few words.",
]

RECIPE = ("Pancakes for four: whisk two eggs with three hundred millilitres of milk, then stir in two "
          "hundred grams of flour, a pinch of salt and a spoonful of sugar until smooth. Let the batter "
          "rest for twenty minutes. Heat a little butter in a pan and pour in a ladle of batter, tilting "
          "the pan so that it spreads thinly. Turn the pancake when the edges lift.")
EMAIL = ("Hi Sam,\n\nThanks for lending me your tent last weekend. It kept us dry through two nights of rain, "
         "and the kids loved it. I cleaned it and left it to dry in the garden; I will bring it back on "
         "Saturday morning.\n\nBest wishes,\nAlex\n")
CLASS = ("class Counter:\n    def __init__(self):\n        self.counts = {}\n\n    def add(self, word):\n"
         "        self.counts[word] = self.counts.get(word, 0) + 1\n\n    def top(self, n):\n"
         "        return sorted(self.counts.items(), key=lambda kv: kv[1])[:n]\n")
SHOPPING = "Shopping list:\n- bread\n- apples\n- rice\n- tomatoes\n- olive oil\n- coffee\n"

#: held-out conversations of the same kind, written on 2026-12-07 after Automatic's tuning (the
#: mixed chat above was tuned on; these were not): pasted text, quotes, edits and copies of it,
#: beside fresh questions
HELD_OUT = {
    "recipe-email": [
        f"Here is my recipe:\n\n{RECIPE}\n\nHow long does the batter rest?",
        "Write the recipe again for eight people: double every amount.",
        "What is a good topping for pancakes?",
        f"Please check this e-mail for mistakes:\n\n{EMAIL}",
        "Copy the e-mail exactly, but write Jordan instead of Sam.",
        "How many legs does a spider have?",
        "Quote the sentence of my recipe that says how to turn the pancake.",
        "Repeat the e-mail once more, word for word.",
    ],
    "class-shopping": [
        f"This class should return the most common words first, but it returns the rarest:\n\n{CLASS}\nFix it.",
        "Write the class again with a docstring for each method.",
        "What does the get method of a dictionary do?",
        f"Here is my list:\n\n{SHOPPING}\nSort it alphabetically.",
        "Add milk and eggs to the original list and write it out.",
        "Name a fruit that is yellow.",
        "Copy my class exactly as I wrote it.",
        "Write the shopping list again without the coffee.",
    ],
}


def _args() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model")
    ap.add_argument("-n", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--same-text", action="store_true",
                    help="every configuration writes none's reply to each turn (teacher-forced)")
    ap.add_argument("--spec-type", action="append", default=None,
                    help="configurations besides none (default: auto and the five n-gram types)")
    ap.add_argument("--chat", choices=["tuned", *HELD_OUT, "questions"], default="tuned",
                    help="the conversation: the one Automatic was tuned on (default), a held-out one, or "
                         "bench/chat-questions.txt asked one after another in one chat")
    ap.add_argument("-md", "--draft-model", default=None,
                    help="a draft model: the configuration auto+md is Automatic with it (name it with --spec-type)")
    return ap, ap.parse_args()


def _turns(chat: str) -> list[str]:
    """The user's turns of the conversation ``--chat`` names."""
    if chat == "questions":
        qfile = Path(__file__).resolve().parent.parent / "bench" / "chat-questions.txt"
        return [q.strip() for q in qfile.read_text(encoding="utf-8").split("\n---\n") if q.strip()]
    return TURNS if chat == "tuned" else HELD_OUT[chat]


class _Bench:
    """One conversation played under each configuration on one loaded target; what each play
    drafted, accepted and (with ``--same-text``) would have picked differently is kept."""

    def __init__(self, ap: argparse.ArgumentParser, a: argparse.Namespace, turns: list[str]):
        from speculators.types import NGRAM_TYPES, PRIORITY
        self.ap, self.a, self.turns = ap, a, turns
        self.configs = ["none"] + (a.spec_type or ["auto"] + [t.value for t in PRIORITY if t in NGRAM_TYPES])
        # the target loaded as the chat loads it for these configurations (its MTP layers, state
        # snapshots: speculators.engine.load_plan), as bench loads it for its rows
        from app.options import ModelOptions
        from app.runtime import open_engine
        from speculators.sampling import SamplingParams
        self.eng = open_engine(ModelOptions(model=a.model, threads=a.threads), build_chain=False,
                               load_for=[self.spec(c) for c in self.configs])
        self.stop = tuple(self.eng.template.stop_strings)
        self.greedy = SamplingParams(temperature=0.0)
        self.ref_tokens: list[list[int]] = []
        self.flips: dict[str, int] = {}
        self.work: dict[str, tuple[int, int]] = {}    # per configuration, its last play: drafted, accepted

    def spec(self, name: str):
        from speculators.params import SpecParams
        if name == "auto+md":
            if not self.a.draft_model:
                self.ap.error("auto+md needs -md PATH")
            sp = SpecParams.auto()
            sp.draft.model = self.a.draft_model
            return sp
        return SpecParams() if name == "none" else SpecParams.auto() if name == "auto" else \
            SpecParams.from_types(name)

    def play(self, name: str, history: list[str] | None) -> tuple[int, float, list[str]]:
        """The conversation under ``name`` (history: none's replies); (tokens, seconds, replies)."""
        a, eng, work = self.a, self.eng, self.work
        eng.set_spec(self.spec(name))         # a fresh chain for the conversation, as a new chat
        messages: list[dict] = []
        n_tok, secs, replies = 0, 0.0, []
        work[name] = (0, 0)
        for i, text in enumerate(self.turns):
            messages.append({"role": "user", "content": text})
            forced = self.ref_tokens[i] if a.same_text and history is not None else None
            r = eng.run(eng.prompt_tokens(messages), max_tokens=a.n, sampling=self.greedy, stop=self.stop,
                        forced=forced)
            if history is None:
                self.ref_tokens.append(list(r.written))      # through its end: every configuration ends there
            elif forced is not None:
                self.flips[name] = self.flips.get(name, 0) + len(r.stats.forced_flips)
            n_tok += max(0, r.stats.n_generated - 1)
            secs += r.stats.t_gen_s
            work[name] = (work[name][0] + r.stats.n_drafted, work[name][1] + r.stats.n_accepted)
            replies.append(r.text)
            messages.append({"role": "assistant", "content": (history[i] if history is not None else r.text).strip()})
        return n_tok, secs, replies

    def drafters_note(self) -> str:
        """Each model drafter's own work over the last conversation, as a suffix of its line."""
        extra = ""
        for sp in (self.eng.chain.speculators if self.eng.chain is not None else []):
            if hasattr(sp, "n_catchups"):
                extra += (f"; {sp.name}: drafting {sp.stats.t_draft_us / 1e6:.2f} s, mirroring and "
                          f"catch-ups {sp.stats.t_process_us / 1e6:.2f} s ({sp.n_catchups} catch-ups, "
                          f"{sp.n_catchup_tokens} tokens)")
        return extra


def _report(b: _Bench, runs: dict[str, list[float]], tokens: dict[str, int], same: dict[str, bool]) -> None:
    """The table: each configuration's best and median speed, against none, and whether it wrote
    none's replies; then Automatic against the fastest fixed type."""
    configs, same_text, flips = b.configs, b.a.same_text, b.flips
    base = max(runs["none"])
    print(f"{'config':<14} {'tok/s best':>10} {'median':>8} {'x none':>7} {'tokens':>7}  "
          + ("own picks all none's" if same_text else "same as none"))
    for c in configs:
        print(f"{c:<14} {max(runs[c]):10.1f} {statistics.median(runs[c]):8.1f} {max(runs[c]) / base:7.2f} "
              f"{tokens[c]:7d}  {'yes' if same[c] else 'no'}")
    if same_text:
        print("--same-text: every configuration wrote none's replies; positions where its own pick differed: "
              + ", ".join(f"{c} {flips.get(c, 0)}" for c in configs if c != "none"))
    fixed = [c for c in configs if c != "none" and not c.startswith("auto")]
    if "auto" in runs and fixed:
        best = max(fixed, key=lambda c: max(runs[c]))
        print(f"auto / fastest fixed type ({best}): {max(runs['auto']) / max(runs[best]):.2f} "
              f"(medians: {statistics.median(runs['auto']) / statistics.median(runs[best]):.2f})")


def main() -> int:
    ap, a = _args()
    b = _Bench(ap, a, _turns(a.chat))
    _, _, reference = b.play("none", None)
    runs: dict[str, list[float]] = {c: [] for c in b.configs}
    same: dict[str, bool] = {c: True for c in b.configs}
    tokens: dict[str, int] = {}
    for rnd in range(a.rounds):
        order = b.configs if rnd % 2 == 0 else b.configs[::-1]
        for c in order:
            n, s, replies = b.play(c, reference)
            runs[c].append(n / s if s else 0.0)
            tokens[c] = n
            same[c] &= ([x.strip() for x in replies] == [x.strip() for x in reference]) if not a.same_text \
                else not b.flips.get(c, 0)
            print(f"  round {rnd + 1} {c:<14} {runs[c][-1]:7.1f} tok/s, drafted {b.work[c][0]}, accepted "
                  f"{b.work[c][1]}{b.drafters_note()}", file=sys.stderr, flush=True)
    _report(b, runs, tokens, same)
    return 0

if __name__ == "__main__":
    sys.exit(main())
