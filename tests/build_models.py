"""Seeded random-weight GGUFs with real shapes, for timing and parity runs.

    python -m tests.build_models --realistic DIR

writes, deterministically (same seeds, same bytes):

* ``DIR/hybrid-mtp.gguf`` -- a ``qwen35`` hybrid shaped like Qwen3.5 0.8B: hidden 1024,
  24 layers (gated delta nets, every 4th layer full attention), 8 query / 2 KV heads of
  256, delta-net state 16 heads x 128 x 128, FFN 3584, one MTP block; Q4_K_M.
* ``DIR/llama-target.gguf`` -- a ``llama`` target of 0.5B shape: hidden 1024, 24 layers,
  16 query / 4 KV heads, FFN 2816; Q4_K_M.
* ``DIR/eagle3.gguf`` -- an EAGLE3 drafter for it (target layers 2, 12, 21); F16.
* ``DIR/dflash.gguf`` -- a DFlash drafter (3 layers over target layers 1, 8, 15, 22;
  block size 16); F16.
* ``DIR/dspark.gguf`` -- the same with DSpark's Markov and confidence heads; F16.

All share one 36,834-token vocabulary (:func:`tests.hidden_models.realistic_vocab`).
Random weights draft badly: these are for speed and for holding the engine against
llama-server (``DRAFTLIGHT_REALISTIC_MODELS=DIR python -m pytest tests/test_native_hidden.py``),
not for acceptance rates.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tests.hidden_models import (realistic_vocab, write_dflash, write_eagle3, write_qwen35_mtp,
                                 write_tiny_llama_target)

NAMES = ("hybrid-mtp.gguf", "llama-target.gguf", "eagle3.gguf", "dflash.gguf", "dspark.gguf")

HIDDEN = 1024
LLAMA_LAYERS = 24


def _quantize(src: Path, dst: Path, ftype: int) -> None:
    import llama_cpp as lc
    params = lc.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = os.cpu_count() or 2
    tmp = dst.with_suffix(".part")
    rc = lc.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise SystemExit(f"quantizing {src.name} failed ({rc})")
    os.replace(tmp, dst)


def build(out: Path, log=print) -> list[Path]:
    import llama_cpp as lc
    out.mkdir(parents=True, exist_ok=True)
    vocab = realistic_vocab()
    toks, scores = vocab
    q4 = int(lc.LLAMA_FTYPE_MOSTLY_Q4_K_M)
    work = out / ".build"
    work.mkdir(exist_ok=True)
    made = []

    def step(name, fn):
        t0 = time.monotonic()
        fn()
        made.append(out / name)
        log(f"{name}: {os.path.getsize(out / name) / 2**20:.0f} MiB in {time.monotonic() - t0:.0f} s")

    def hybrid():
        f16 = write_qwen35_mtp(work / "hybrid-mtp-f16.gguf", n_embd=HIDDEN, n_ff=3584, n_head=8, n_head_kv=2,
                               head_dim=256, n_trunk=24, full_attention_interval=4, d_state=128,
                               n_group=16, dt_rank=16, d_conv=4, rope_dims=64, rope_sections=(11, 11, 10, 0),
                               vocab=vocab, half=True, seed=100, name="realistic-hybrid-mtp")
        _quantize(f16, out / "hybrid-mtp.gguf", q4)
        f16.unlink()

    def target():
        f16 = write_tiny_llama_target(work / "llama-target-f16.gguf", n_embd=HIDDEN, n_layer=LLAMA_LAYERS,
                                      n_ff=2816, n_head=16, n_head_kv=4, vocab=vocab, half=True, seed=101,
                                      name="realistic-llama-target")
        _quantize(f16, out / "llama-target.gguf", q4)
        f16.unlink()

    def atomic(name, writer, **kw):
        tmp = work / name
        writer(tmp, **kw)
        os.replace(tmp, out / name)

    step("hybrid-mtp.gguf", hybrid)
    step("llama-target.gguf", target)
    step("eagle3.gguf", lambda: atomic("eagle3.gguf", write_eagle3, target_hidden=HIDDEN,
                                       target_layers=(2, 12, 21), n_embd=HIDDEN, n_ff=2816, n_head=16,
                                       vocab=toks, scores=scores, half=True, seed=102))
    common = dict(target_hidden=HIDDEN, target_layers=(1, 8, 15, 22), n_layer=3, n_ff=2816, n_head=16,
                  block_size=16, vocab=toks, scores=scores, half=True)
    step("dflash.gguf", lambda: atomic("dflash.gguf", write_dflash, seed=103, **common))
    step("dspark.gguf", lambda: atomic("dspark.gguf", write_dflash, seed=104, dspark=True, markov_rank=64,
                                       **common))
    try:
        work.rmdir()
    except OSError:
        pass
    return made


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.build_models", description=__doc__.split("\n\n")[0])
    ap.add_argument("--realistic", metavar="DIR", required=True, help="where to write the models")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    build(Path(a.realistic), log=lambda m: print(m, flush=True))
    print(f"done in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
