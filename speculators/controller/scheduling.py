"""When the controller asks, probes and keeps up each drafter: a model drafter's probes (how
often, and what they cost), its upkeep paused or resumed, what was measured of it remembered for
the engine's later chains, and how often a cold lookup drafter is asked.

A mixin of :class:`~speculators.controller.Controller` (with
:class:`~speculators.controller.pricing.Pricing`): it reads ``self.params``, ``self.cost``,
``self.step``, ``self.states`` and ``self.t1_s``.
"""

from __future__ import annotations

import math
from typing import Sequence

from .models import clip_stall
from .state import NEVER, Decision, SpecState


class Scheduling:
    """The controller's probes, upkeep and asking intervals (see the module docstring)."""

    def _known_short(self, state: SpecState) -> None:
        """A model drafter an earlier chain of this engine measured short of paying (nor near
        it, at its overall rate): a fresh chain does not probe it at once, nor have it mirror
        the prompt first (a draft model of the target's size decoding a 330-token chat
        prompt: ~0.5 s on a 2-core CPU), but at its probes' share of the time, as after its
        early probes in that chain.

        >>> from types import SimpleNamespace
        >>> from speculators.controller import Controller, ControllerParams, SpecState
        >>> ctl = Controller.__new__(Controller)
        >>> ctl.params, ctl.cost, ctl.step = ControllerParams(), SimpleNamespace(t1_s=0.02), 0   # 20 ms steps
        >>> state = SpecState.__new__(SpecState)
        >>> state.probe_s, state.upkeep_on, state.pausable, state.known_short = 0.5, True, False, False
        >>> ctl._known_short(state); state.next_probe, state.known_short   # 0.5 s / (1.5 % of 20 ms)
        (1667, True)
        >>> state.probe_s = 0.001; ctl._known_short(state); state.next_probe   # never sooner than probe_every
        16
        """
        p = self.params
        state.known_short = True
        # the first probe at its share of the time (a paused draft model's probe first decodes
        # all it missed: the whole prompt the first time)
        interval = self._share_interval(state, p.probe_share, p.probe_every)
        state.probe_every = min(p.probe_every_max, interval)
        state.next_probe = self.step + interval
        self._set_upkeep(state, False)

    def _give_up(self, state: SpecState) -> None:
        """Until its rare probe (none when its size says it cannot pay): not asked, not mirrored."""
        state.hopeless = True
        state.probe_every = self.params.probe_every_hopeless
        state.next_probe = NEVER if state.t_prior else self.step + state.probe_every
        self._set_upkeep(state, False)

    def _price_from_sizes(self, state: SpecState) -> None:
        """A drafter whose model is about as large as the target's cannot pay: known before it
        costs anything (a draft model mirrors the whole prompt before its first draft).

        ``spec.cost_prior``: its model's size over the target's, where both are placed alike
        (None: no prior, it is measured). Its drafted tokens are priced at that share of a
        target step (times ``prior_optimism``), its upkeep at nothing: if it is hopeless even
        so, it waits for its rare probe, where it is measured."""
        prior = getattr(state.spec, "cost_prior", None)
        if not prior or prior <= 0:
            return
        state.t_call = self.params.prior_optimism * float(prior) * self.t1_s
        state.t_prior = True
        if self._is_hopeless(state):
            self._give_up(state)
        else:
            state.t_call, state.t_prior = None, False   # it may pay: what it costs is measured

    @staticmethod
    def _cost_key(state: SpecState) -> str:
        return str(getattr(state.spec, "cost_key", None) or state.name)

    def _measured(self, state: SpecState) -> None:
        """A model drafter's cost was measured again: whether it can pay at all, remembered for
        this engine's later chains (not from a first, cold call alone: that judges nothing)."""
        if state.t_cold:
            return
        if state.t_call is not None:
            state.hopeless = self._is_hopeless(state)
        self._remember(state)

    def _remember(self, state: SpecState) -> None:
        key = self._cost_key(state)
        # its acceptance model, once it has seen a draft (else the one remembered before): a
        # later chain starts from its rates (read then, not at every step here)
        accept = state.model if state.model.n_observed > 0.0 else self.cost.drafters.get(key, {}).get("accept")
        self.cost.drafters[key] = {"t_call": state.t_call, "upkeep_s": state.upkeep_s, "hopeless": state.hopeless,
                                   "accept": accept, "probe_s": state.probe_s}

    def _set_upkeep(self, state: SpecState, on: bool) -> None:
        """Resume or pause a drafter's per-batch work (where it can pause; lossless either way:
        a resumed drafter catches up on the target's tokens before it drafts)."""
        if on == state.upkeep_on or not state.pausable:
            return
        state.spec.set_upkeep(on)
        state.upkeep_on = on


    def _soon_interval(self, state: SpecState) -> int:
        """Steps to the next probe of a drafter that pays (or nearly) over a stretch, after
        ``missed_in_row`` rejected first tokens: ``probe_every_early``, doubling with each miss
        past the ones it drafts through (``miss_tolerance``)."""
        p = self.params
        doublings = min(max(0, state.missed_in_row - 1 - p.miss_tolerance), 16)
        return min(p.probe_every_max, p.probe_every_early << doublings)

    def _hopeless_interval(self, state: SpecState) -> int:
        """Steps until a hopeless drafter's next probe: its last probe's cost (its catch-up
        included) at most ``probe_hopeless_share`` of the steps' time.

            >>> from types import SimpleNamespace
            >>> from speculators.controller import Controller, ControllerParams, SpecState
            >>> ctl = Controller.__new__(Controller)
            >>> ctl.params, ctl.cost = ControllerParams(), SimpleNamespace(t1_s=0.0125)  # 12.5 ms steps
            >>> state = SpecState.__new__(SpecState)
            >>> state.probe_s = 0.22                # a probe that first decoded 60 missed tokens
            >>> ctl._hopeless_interval(state)       # 0.22 s / (0.5 % of 12.5 ms)
            3520
            >>> state.probe_s = 0.001
            >>> ctl._hopeless_interval(state)
            256
        """
        p = self.params
        return min(self._share_interval(state, p.probe_hopeless_share, p.probe_every_hopeless),
                   p.probe_every_hopeless_max)

    def _share_interval(self, state: SpecState, share: float, at_least: int) -> int:
        """Steps between probes of ``state`` so that they (its last probe's cost, a paused
        drafter's catch-up included) take at most ``share`` of the steps' time; never fewer
        than ``at_least``.

            >>> from types import SimpleNamespace
            >>> from speculators.controller import Controller, ControllerParams, SpecState
            >>> ctl = Controller.__new__(Controller)
            >>> ctl.params, ctl.cost = ControllerParams(), SimpleNamespace(t1_s=0.02)  # 20 ms steps
            >>> state = SpecState.__new__(SpecState)
            >>> state.probe_s = 0.027               # a probe that first caught a paused head up
            >>> ctl._share_interval(state, 0.015, 16), ctl._share_interval(state, 0.03, 16)   # 27 ms / (1.5 % of 20 ms)
            (90, 45)
        """
        t1 = self.t1_s or 0.0
        if t1 <= 0 or share <= 0:
            return at_least
        return max(at_least, math.ceil(state.probe_s / (share * t1) - 1e-9))

    def _probe_interval(self, state: SpecState) -> int:
        n_cold = max(1, len(self.states))
        share = self._draft_cost(state, 1) if state.t_call is not None else 0.0
        budget = self.params.probe_budget / n_cold
        return max(1, min(64, math.ceil(share / budget))) if share > 0 else 1

    def _after_verify(self, state: SpecState, dec: Decision, ids: Sequence[int], n_accepted: int | None) -> None:
        """A draft of ``state`` was verified: its misses in a row, and a drafter that pays (or
        nearly) over a stretch, paused by a run of misses, probed again soon."""
        hit = bool(len(ids) - 1 if n_accepted is None else n_accepted)
        state.missed_in_row = 0 if hit else state.missed_in_row + 1
        if not hit and not dec.probe and state.expensive and self._worth_probing_soon(state):
            # a drafter that pays (or nearly) over a stretch, paused by a run of misses:
            # probed again soon, as after a missed probe (below)
            state.next_probe = min(state.next_probe, self.step + self._soon_interval(state))

    def _after_probe(self, state: SpecState, ids: Sequence[int], seconds: float | None,
                     n_accepted: int | None) -> None:
        """A probe of ``state`` was verified: what it cost, and when the next one comes."""
        n_acc = len(ids) - 1 if n_accepted is None else n_accepted
        p = self.params
        if seconds is not None:
            # what the probe cost beyond the tokens it produced: the time between probes
            # is that over the share of the steps' time they may take
            state.probe_s = max(0.0, state.probe_s + seconds - len(ids) * self.t1_s)
        # its first probes: what it is worth is learnt within a few steps
        early = state.counters["probes"] <= p.probe_early_n and not state.known_short
        soon = False
        base = p.probe_every_early if early else p.probe_every
        if state.t_cold:
            # only its first, cold call is timed: what it costs is not known yet
            state.probe_every = base
        elif state.hopeless:
            # its costs alone outweigh what a verify can save: only re-measure now and then
            state.probe_every = self._hopeless_interval(state)
        elif early:
            # a fresh chain's first few probes: what the drafter is worth is learnt
            # within a few steps, whatever they cost (a head whose first two probes
            # happen to miss, as one in fifteen of a 79 %-right MTP head's do, was
            # judged on them alone and left for 80 steps: most of a reply)
            state.probe_every = base
        else:
            # what it is expected to gain now, with this probe's outcome scored
            _, g = self._potential(state, p.max_len)
            if n_acc == 0 and self._worth_probing_soon(state):
                # a miss after misses, from a drafter whose drafts pay, or nearly, over a
                # stretch, misses included (a 79 %-right MTP head misses three first
                # tokens in a row now and then, and after a few drafts that is all its
                # estimate knows): a probe costs about what it brings, so it is probed
                # again within its upkeep's linger, backing off while it keeps missing,
                # instead of waiting out its probes' share of the time (80 steps after
                # a missed 3-token probe on a CPU)
                state.probe_every = self._soon_interval(state)
                soon = True
            else:
                if n_acc > 0 and g >= p.probe_near * (1.0 + p.margin):
                    # near paying: probed more often, at twice the share of the time
                    share, n = 2 * p.probe_share, base
                else:
                    # short of paying: a missed probe doubles the wait, an accepted one
                    # starts it over; either way its probes keep to their share of the time
                    share, n = p.probe_share, (max(p.probe_every, state.probe_every * 2)
                                               if n_acc == 0 else base)
                state.probe_every = min(p.probe_every_max, self._share_interval(state, share, n))
        # (decide() set the next probe from the interval before this one's outcome)
        state.next_probe = (self.step + state.probe_every if early or soon
                            else max(state.next_probe, self.step + state.probe_every))

    def _observe_upkeep(self, n_draft: int) -> float:
        """Charge each model drafter the per-batch work it did this step; the seconds in all."""
        total = 0.0
        rel = self.rel(n_draft)
        for state in self.states.values():
            if state.process_us_at_decide is None:
                continue
            dt = (state.spec.stats.t_process_us - state.process_us_at_decide) * 1e-6
            state.process_us_at_decide = None
            if dt <= 0.0:
                continue
            total += dt
            if state.counters:
                state.counters["upkeep_ms"] += dt * 1e3
            if not state.upkeep_on:
                continue  # a paused drafter's bookkeeping (or a catch-up): not its running cost
            x = dt / rel
            if state.upkeep_s is None:
                state.upkeep_s = x
            else:
                x = clip_stall(x, state.upkeep_s)
                state.upkeep_s += 0.2 * (x - state.upkeep_s)
            self._measured(state)
        return total
