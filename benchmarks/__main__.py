"""``python -m benchmarks``: the harness over every built-in workload (``--help``)."""

from __future__ import annotations

import sys

from .command import main

if __name__ == "__main__":  # the forkserver imports this module too, as __mp_main__
    sys.exit(main())
