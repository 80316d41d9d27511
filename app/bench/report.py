"""``bench``'s report: the JSON it prints (every row against none, the prompts on which two rows
did the same work, the flips of forced runs, the cost model as the runs refined it) and the table
a person reads, with the progress line on stderr while it runs."""

from __future__ import annotations

import sys

from speculators.params import SpecParams

from ..measure import Row
from .reference import REFERENCE


def same_work(a: dict, b: dict) -> list[int]:
    """The prompts on which two report rows did the same work in every round: as many
    drafted and accepted tokens and as many steps (the time spent in drafters aside). There
    the two rows' ratio is the machine's timing alone, not a difference between them.

        >>> a = {"per_prompt": [{"rounds_work": [[4, 3, 9, 1.5], [4, 3, 9, 1.2]]},
        ...                     {"rounds_work": [[0, 0, 12, 0.0]]}]}
        >>> b = {"per_prompt": [{"rounds_work": [[4, 3, 9, 0.9], [4, 3, 9, 1.0]]},
        ...                     {"rounds_work": [[2, 0, 12, 0.4]]}]}
        >>> same_work(a, b)
        [0]
    """
    out = []
    for i, (da, db) in enumerate(zip(a.get("per_prompt") or [], b.get("per_prompt") or [])):
        wa, wb = da.get("rounds_work"), db.get("rounds_work")
        if wa and wb and len(wa) == len(wb) and all(x[:3] == y[:3] for x, y in zip(wa, wb)):
            out.append(i)
    return out


def flips_of(runs: list[list]) -> list[dict]:
    """The distinct flips of a prompt's forced runs (each run's ``forced_flips``), by
    position: where the model's own pick was not the forced text's, the largest logit
    margin seen there, and in how many runs.

        >>> from speculators.sampling import Flip
        >>> flips_of([[Flip(7, 10, 11, 0.25)], [], [Flip(7, 10, 11, 0.5), Flip(2, 3, 4, 0.0)]])
        [{'index': 2, 'forced': 3, 'own': 4, 'margin': 0.0, 'runs': 1}, {'index': 7, 'forced': 10, 'own': 11, 'margin': 0.5, 'runs': 2}]
    """
    seen: dict[int, dict] = {}
    for flips in runs:
        for f in flips or ():
            d = seen.setdefault(f.index, {"index": f.index, "forced": f.forced, "own": f.own,
                                         "margin": f.margin, "runs": 0})
            d["runs"] += 1
            if f.margin > d["margin"]:
                d["margin"] = f.margin
    return [seen[i] for i in sorted(seen)]


def summarise(report: dict, ordered: list[Row], none_row: Row, engine, base_spec: SpecParams,
              same_text: bool) -> None:
    """Fill ``report`` with the rows in ``ordered`` (speedups against ``none_row``), the prompts
    on which auto did another row's work, the verify-cost curve as the runs refined it, none's
    speed against llama-cpp-python's own, and whether the outputs are the model's own."""
    base_tps = none_row.tps
    report["rows"] = [r.to_dict(base_tps) for r in ordered]
    for r in report["rows"]:
        if r["name"] == "auto":
            # the prompts where Automatic did what another row did, round for round
            r["same_work_as"] = {o["name"]: same_work(r, o) for o in report["rows"]
                                 if o is not r and o["name"] != REFERENCE and o.get("per_prompt")}
    cm = engine.cost_model
    if cm is not None and "cost_curve" in report:
        # the curve as the steps of this run refined it
        report["cost_curve"]["online"] = [round(cm.rel(k), 4) for k in range(17)]
        report["cost_curve"]["t1_ms"] = round(cm.t1_s * 1000, 3)
    if ordered[0].name == REFERENCE and ordered[0].tps > 0:
        report["none_vs_llama_cpp_python"] = round(base_tps / ordered[0].tps, 3)
    report["synthetic"] = bool(base_spec.synth_len is not None or base_spec.synth_rates)
    report["same_text"] = same_text


def progress(name: str) -> None:
    """Show what runs now on the progress line (only where stderr is a terminal)."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\rbench: {name:<60}")
        sys.stderr.flush()


def print_table(report: dict) -> None:
    """The report as a person reads it: one line per row, then per prompt, then notes."""
    if sys.stderr.isatty():
        sys.stderr.write("\r" + " " * 70 + "\r")
    _print_rows(report)
    _print_per_prompt(report)
    _print_notes(report)


def _print_rows(report: dict) -> None:
    """The heading, the table of rows, and what each draft model costs per drafted token."""
    print(f"model: {report['model']}  ctx {report['n_ctx']}  threads {report['threads']}  "
          f"prompts {report['prompts']} × {report['max_tokens']} tokens")
    hdr = f"{'type':<28}{'tok/s':>8}{'speedup':>9}{'drafted':>9}{'accepted':>9}{'acc%':>7}" \
          f"{'mal':>6}{'ms/draft':>9}{'ceiling':>9}{'of ceil':>8}  same"
    print(hdr)
    print("-" * len(hdr))
    for r in report["rows"]:
        def f(v, fmt):
            return format(v, fmt) if v is not None else "-"
        acc = r["acceptance_rate"]
        print(f"{r['name'][:27]:<28}{r['tokens_per_s']:>8.1f}{f(r['speedup_vs_none'], '.2f'):>9}"
              f"{r['drafted']:>9}{r['accepted']:>9}{f(acc * 100 if acc is not None else None, '.1f'):>7}"
              f"{f(r['mean_acceptance_length'], '.2f'):>6}{f(r['draft_ms_per_call'], '.3f'):>9}"
              f"{f(r['ceiling_tokens_per_s'], '.1f'):>9}{f(r['fraction_of_ceiling'], '.2f'):>8}  "
              f"{'yes' if r['equal_to_none'] else ('-' if r['equal_to_none'] is None else 'NO')}")
    for r in report["rows"]:
        for name, sp in (r.get("speculators") or {}).items():
            if name.startswith("draft-") and sp.get("cost_ms_per_drafted_token") is not None:
                print(f"{r['name']}: {name} costs {sp['cost_ms_per_drafted_token']:.2f} ms per drafted token "
                      f"(drafting and mirroring the target's batches)")


def _print_per_prompt(report: dict) -> None:
    """Each drafting row's speedup per prompt (and per round where there were several), what its
    controller did, and the prompts on which it did another row's work."""
    for r in report["rows"]:
        pp = r.get("per_prompt") or []
        if r["name"] in ("none", REFERENCE) or not pp:
            continue
        sp = [d.get("speedup_vs_none") for d in pp if d.get("speedup_vs_none") is not None]
        line = f"{r['name']}: per prompt × none: " + " ".join(f"{x:.2f}" for x in sp)
        if sp:
            line += f"  (min {min(sp):.2f})"
        pr = [d.get("speedup_vs_none_paired") for d in pp if d.get("speedup_vs_none_paired") is not None]
        if pr and report.get("rounds", 1) > 1:
            line += "; median of paired rounds: " + " ".join(f"{x:.2f}" for x in pr) + f"  (min {min(pr):.2f})"
        if r.get("controller") is not None:
            quiet = sum(1 for d in pp if d.get("controller") and d["controller"]["drafted"] == 0)
            c = r["controller"]
            line += (f"; controller: {c['n_drafted']} of {c['n_steps']} steps drafted ({c['n_cut']} cut), "
                     f"{c['n_skipped']} skipped, {quiet} of {len(pp)} prompts without a draft")
        print(line)
    for r in report["rows"]:
        sw = r.get("same_work_as")
        n = len(r.get("per_prompt") or [])
        if sw and n > 1:
            parts = [f"{name} on {len(ix)} of {n}" + (f" ({' '.join(str(i) for i in ix)})" if 0 < len(ix) < n else "")
                     for name, ix in sw.items()]
            print(f"{r['name']} did the same work (drafted, accepted, steps, every round) as "
                  + ", ".join(parts) + ": on those prompts the two rows' ratio is the machine's timing alone")


def _print_notes(report: dict) -> None:
    """What the figures rest on: forced text, the reference, synthetic acceptance, lookup learning."""
    if report.get("same_text"):
        print("--same-text: every row wrote none's reply to each prompt; 'same' says whether the model's "
              "own pick was none's at every position")
        for r in report["rows"]:
            flips = [f for d in r.get("per_prompt") or [] for f in d.get("flips") or ()]
            if flips:
                print(f"  {r['name']}: {len(flips)} positions where it was not (largest logit margin "
                      f"{max(f['margin'] for f in flips):.3f})")
    if "none_vs_llama_cpp_python" in report:
        print(f"none through draftlight's loop runs at {report['none_vs_llama_cpp_python']:.3f}× "
              f"llama-cpp-python's own generation")
    if report.get("synthetic"):
        print("synthetic acceptance was on: outputs are not valid")
    lk = report.get("lookup_learn")
    if lk:
        w, wo = lk["with"], lk["without"]
        print(f"lookup learning: {lk['learn_prompts']} prompts answered first ({lk['learn_tokens']} tokens) "
              f"filled a dynamic cache of {lk['dynamic_ngrams']} n-grams, {lk['dynamic_entries']} entries")
        print(f"  ngram-cache without it: drafted {wo['drafted']:>6}  accepted {wo['accepted']:>6}")
        print(f"  ngram-cache with it:    drafted {w['drafted']:>6}  accepted {w['accepted']:>6}  "
              f"(from the dynamic cache: {w['sources']['dynamic']['accepted']} accepted of "
              f"{w['sources']['dynamic']['drafted']} drafted)")
