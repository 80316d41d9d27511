"""F4's panel: the session's statistics per speculator, acceptance by draft position, lookup caches.

May touch: its own text (it is given the session's statistics, the lookup figures and the styles).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.style import Style
from textual.widgets import Static

from ...cmd_doctor import human_size
from ..stats import SessionStats, acceptance_bars, pct


#: what F4's terms mean, at the end of the panel
STATS_TERMS = (
    ("calls b/g/a", "how often the speculator was told a reply Began, asked to Generate a draft, "
                    "and told how much of its draft was Accepted (llama.cpp's #calls(b,g,a))"),
    ("ms b/g/a", "time spent in those three calls"),
    ("drafts gen/acc", "drafts made / drafts of which at least one token was accepted"),
    ("mean acc len", "1 + accepted tokens per verified draft, as llama.cpp reports it"),
    ("on / cold", "Automatic's view: on = its drafts are worth verifying now; cold = not at the "
                  "moment (asked only now and then, to see whether that changed). acc is the "
                  "acceptance it expects, gain the speed-up it expects from verifying"),
)


class StatsPanel(VerticalScroll, can_focus=True):
    """Per-speculator statistics of the session and acceptance by draft position.

    Tab reaches it; the arrows, PageUp/PageDown and Home/End scroll it (a scroll
    container's own keys). The text is :attr:`body`."""

    DEFAULT_CSS = """
    StatsPanel {
        width: 40%; min-width: 30; max-width: 44; dock: right; height: 1fr; padding: 0 1;
        background: $surface; border-left: tall $panel; scrollbar-size-vertical: 1;
    }
    StatsPanel:focus { border-left: tall $primary; }
    StatsPanel > Static { height: auto; }
    """

    def __init__(self, **kw: Any):
        super().__init__(**kw)
        self.body = Static("")

    def compose(self) -> ComposeResult:
        yield self.body

    def show_stats(self, session: SessionStats, live: bool, styles: Mapping[str, Style],
                   lookup: Mapping[str, Any] | None = None, active: Sequence[str] | None = None,
                   auto: bool | None = None) -> None:
        """``active``: the speculators of the running configuration, in priority order, and
        ``auto``: whether Automatic's controller runs them (None for either: whatever has figures).
        Speculators with figures that are not active any more (and Automatic's decisions, once it
        is off) are listed apart, as earlier in this session; the lookup caches only while
        ngram-cache is active."""
        t = session.totals
        f = t.figures
        lines: list[Content] = [Content.styled("Session statistics" + ("  ● live" if live else ""),
                                               "bold $primary")]
        lines.append(Content(f"replies {t.replies} · tokens {t.n_tokens} · {t.tokens_per_s:.1f} tok/s"))
        lines.append(Content(f"drafted {t.n_drafted} · {f.accepted_text()}"))
        mal = f.mean_acceptance_length
        lines.append(Content(f"mean acceptance length {mal:.2f}" if mal else "mean acceptance length –"))
        names = list(active) if active is not None else list(session.speculators)
        earlier = [n for n in session.speculators if n not in names]
        ctl = session.controller
        ctl_active = ctl is not None and (auto if auto is not None else True)
        lines.append(Content(""))
        if active is not None:
            now = ("Automatic: " if auto else "Speculation: ") + (", ".join(names) if names else "off")
            lines.append(Content.styled(now, "bold $secondary"))
        if ctl_active:
            lines.append(Content.styled("Automatic speculation: what it decided", "bold $secondary"))
            lines.extend(Content(" " + line) for line in ctl.summary())
        if not names:
            lines += [Content.styled("No speculator is on.", "$foreground-muted"),
                      Content.styled("Choose speculation in Settings (F3).", "$foreground-muted")]
        elif not any(n in session.speculators for n in names):
            lines += [Content.styled("No speculator has run yet.", "$foreground-muted")]
        width = max(8, (self.size.width or 40) - 18)
        for name in names:
            s = session.speculators.get(name)
            if s is not None:
                lines += _speculator_lines(name, s, styles.get(name), session.shown_by.get(name, 0), width)
        if lookup and (active is None or "ngram-cache" in names):
            lines += _lookup_lines(lookup)
        if earlier or (ctl is not None and not ctl_active):
            lines += _earlier_lines(session, earlier, controller_off=ctl is not None and not ctl_active)
        if session.speculators or ctl is not None:
            lines.append(Content(""))
            lines.append(Content.styled("What the terms mean", "bold $secondary"))
            for term, meaning in STATS_TERMS:
                lines.append(Content.assemble((f" {term}: ", "bold"), (meaning, "$foreground-muted")))
        self.body.update(Content("\n").join(lines))


def _speculator_lines(name: str, s: Any, st: Style | None, shown: int, width: int) -> list[Content]:
    """One speculator's block: its calls, drafts, tokens (``shown``: its tokens in the replies),
    times, and acceptance by draft position as bars ``width`` cells long, in its style ``st``."""
    lines = [Content(""),
             Content.styled(f"■ {name}" if not (st and st.background) else f" {name} ", st or "bold"),
             Content(f" calls b/g/a   {s.n_call_begin}/{s.n_call_draft}/{s.n_call_accept}"),
             Content(f" drafts gen/acc {s.n_gen_drafts}/{s.n_acc_drafts}")]
    extra = f"; {shown} in replies" if shown != s.n_acc_tokens else ""
    lines.append(Content(f" tokens gen/acc {s.n_gen_tokens}/{s.n_acc_tokens} "
                         f"({pct(s.acceptance_rate)}{extra})"))
    m = s.mean_acceptance_length
    lines.append(Content(f" mean acc len   {m:.2f}" if m else " mean acc len   –"))
    lines.append(Content(f" ms b/g/a  {s.t_begin_us / 1000:.1f}/{s.t_draft_us / 1000:.1f}/"
                         f"{s.t_accept_us / 1000:.1f}"))
    bars = acceptance_bars(s, width=width)
    if bars:
        lines.append(Content.styled(" acceptance by draft position", "$foreground-muted"))
        for pos, b, rate in bars:
            lines.append(Content.assemble(f" {pos:>3} ", (b, st or "$accent"), f" {rate * 100:3.0f}%"))
        more = len(s.n_acc_tokens_per_pos) - len(bars)
        if more > 0:
            lines.append(Content.styled(f"     … {more} more positions", "$foreground-muted"))
    return lines


def _lookup_lines(lookup: Mapping[str, Any]) -> list[Content]:
    """The lookup caches' block: entries and file size per cache, what each drafted, what is unsaved."""
    lines = [Content(""), Content.styled("Lookup caches (ngram-cache)", "bold $secondary")]
    for kind in ("static", "dynamic"):
        c = (lookup.get("caches") or {}).get(kind) or {}
        size = human_size(c.get("file_bytes", 0)) if c.get("exists") else "no file yet"
        lines.append(Content(f" {kind:<8} {c.get('entries', 0):,} entries · {size}"))
    src = lookup.get("sources") or {}
    if src:
        lines.append(Content.styled(" accepted / drafted by cache", "$foreground-muted"))
        for kind in ("context", "dynamic", "static"):
            d = src.get(kind) or {}
            lines.append(Content(f"  {kind:<8} {d.get('accepted', 0)} / {d.get('drafted', 0)}"))
    pending = lookup.get("pending_entries") or 0
    if pending:
        lines.append(Content.styled(f" {pending:,} entries learned, not saved yet", "$foreground-muted"))
    return lines


def _earlier_lines(session: SessionStats, earlier: Sequence[str], controller_off: bool) -> list[Content]:
    """Figures of speculation that is not running now: apart, and said to be so."""
    lines = [Content(""), Content.styled("Earlier in this session (not in use now)", "bold $foreground-muted")]
    if controller_off:
        lines.append(Content.styled(" Automatic's controller: off now", "$foreground-muted"))
    for name in earlier:
        s = session.speculators[name]
        lines.append(Content.styled(f" {name:<13} tokens gen/acc {s.n_gen_tokens}/{s.n_acc_tokens} "
                                    f"({pct(s.acceptance_rate)})", "$foreground-muted"))
    return lines
