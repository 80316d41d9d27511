"""The command line: ``python tools/soak.py --seed N --actions 300 --faults 30``.
"""

from __future__ import annotations

import argparse
import sys

from .figures import Options
from .run import run


def main(argv: list[str] | None = None, doc: str = "") -> int:
    """Parse ``argv``, run the soak, print its report; 0 only when nothing failed. ``doc``: the text
    whose first paragraph ``--help`` shows (``tools/soak.py``'s docstring)."""
    ap = argparse.ArgumentParser(description=(doc or __doc__).split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--actions", type=int, default=300)
    ap.add_argument("--faults", type=int, default=30)
    ap.add_argument("-m", "--model", help="the GGUF to chat with (default: the embedded default model)")
    ap.add_argument("-n", "--max-tokens", type=int, default=32, help="the chat's reply limit (default 32)")
    ap.add_argument("--keep", metavar="DIR", help="the run's folder (default: a temp folder)")
    ap.add_argument("--cache-dir", metavar="DIR", help="the app's cache folder (default: the run's own; "
                    "one kept from an earlier run skips the CPU probe and the cost curve's measuring)")
    ap.add_argument("--max-seconds", type=float, default=600.0, help="stop the steps after this long")
    ap.add_argument("--max-failures", type=int, default=40, help="stop the steps after this many failures")
    ap.add_argument("--disk", choices=("auto", "tmpfs", "fsize"), default="auto",
                    help="how the data folder is made full (auto: tmpfs where it can be mounted)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print the figures only, not each step")
    a = ap.parse_args(argv)
    import shutil
    if shutil.which("tmux") is None:
        print("soak: tmux is not installed", file=sys.stderr)
        return 2
    res = run(Options(seed=a.seed, actions=a.actions, faults=a.faults, model=a.model, base=a.keep, cache_dir=a.cache_dir,
                      max_tokens=a.max_tokens, max_seconds=a.max_seconds, max_failures=a.max_failures,
                      disk=a.disk, quiet=a.quiet))
    print()
    print(res.report())
    return 0 if res.ok else 1
