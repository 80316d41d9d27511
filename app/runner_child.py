"""``python -m app.runner_child FD``: the runner process (see :mod:`app.runner`).

A module of its own, so that the runner's classes pickle under their real
names (``app.runner.EngineSnapshot``, not ``__main__.…``).
"""

import sys

from app.runner import main

if __name__ == "__main__":
    sys.exit(main())
