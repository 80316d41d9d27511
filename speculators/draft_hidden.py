"""Hidden-state drafters: draft-mtp, draft-eagle3, draft-dflash, draft-dspark.

These read the target model's hidden states after every target decode, as
``common_speculative_impl_draft_mtp`` (and its EAGLE3 / DFlash siblings) of
llama.cpp do. What llama-cpp-python does not bind is looked up in the same
shared library by :mod:`speculators.ext`.

One module per drafter, plus the shared base (as vLLM's spec-decode proposers):

* :mod:`speculators.hidden_base` -- how the target's hidden states reach a
  drafter (a decode hook on the target context), the token+embedding batch,
  reference-counted target outputs, the top-k draft pick;
* :mod:`speculators.draft_mtp` -- draft-mtp (the target's own NextN/MTP heads);
* :mod:`speculators.draft_eagle3` -- draft-eagle3;
* :mod:`speculators.draft_dflash` -- draft-dflash and draft-dspark (block drafters
  with KV injection).

This module declares the four types (their :class:`~speculators.descriptor.SpecDescriptor`),
imports the drafters so their factories register with the chain, and
re-exports their public names.
"""

from __future__ import annotations

from .hidden_base import (DRAFT_TOP_K, LAYER_INPUT_ARCHS, _TargetFed, _TokEmbdBatch,  # noqa: F401
                          _enable_output, _engine_parts, _require, _rows, pick_top_k)
from .draft_mtp import LLAMA_CONTEXT_TYPE_MTP, MTP_SYMBOLS, DraftMTP, make_draft_mtp  # noqa: F401
from .draft_eagle3 import EAGLE3_SYMBOLS, DraftEagle3, check_layer_ids, make_draft_eagle3  # noqa: F401
from .draft_dflash import (DFLASH_DEFAULT_BLOCK_SIZE, DFLASH_SYMBOLS, FINAL_LAYER_INPUT_ARCHS,  # noqa: F401
                           DraftDFlash, DraftDSpark, _InjectBatch, _has_markov_head, _make_block_drafter,
                           _meta_bool, check_dflash_drafter, dspark_cut, make_draft_dflash,
                           make_draft_dspark, output_limits, walk_lattice)
from .descriptor import HIDDEN, Drafter, MtpHeads, SpecDescriptor, declare
from .draft_simple import draft_n_max
from .gguf_detect import has_markov_head, has_mtp_heads, is_dflash_drafter

declare(SpecDescriptor(
    name="draft-eagle3", rank=70, kind=HIDDEN,
    info="EAGLE-3 drafter on the hidden states",
    needs=Drafter(label="EAGLE-3", arch="eagle3"), drafter_label="EAGLE3",
    section="draft", n_max=draft_n_max))
declare(SpecDescriptor(
    name="draft-mtp", rank=80, kind=HIDDEN,
    info="the model's multi-token-prediction heads",
    needs=MtpHeads(), load=frozenset({"mtp"}),
    section="draft", n_max=draft_n_max,
    detect=has_mtp_heads))
declare(SpecDescriptor(
    name="draft-dflash", rank=90, kind=HIDDEN,
    info="DFlash block drafter",
    needs=Drafter(label="DFlash"), drafter_label="DFlash",
    section="draft", n_max=draft_n_max,
    detect=lambda i: is_dflash_drafter(i) and not has_markov_head(i)))
declare(SpecDescriptor(
    name="draft-dspark", rank=100, kind=HIDDEN,
    info="DSpark drafter",
    needs=Drafter(label="DSpark"), drafter_label="DSpark",
    section="draft", n_max=draft_n_max,
    detect=lambda i: is_dflash_drafter(i) and has_markov_head(i)))

__all__ = ["DraftMTP", "DraftEagle3", "DraftDFlash", "DraftDSpark", "pick_top_k", "output_limits",
           "walk_lattice", "dspark_cut", "check_layer_ids", "check_dflash_drafter",
           "LAYER_INPUT_ARCHS", "FINAL_LAYER_INPUT_ARCHS"]
