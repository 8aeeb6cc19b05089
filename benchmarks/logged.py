"""Run a training module with fthsdp's INFO log on stderr (the benchmarks' ranks: their logs then say what happened).

    python benchmarks/logged.py MODULE [ARGS...]

The training library configures no logging of its own (a script decides);
this does it for a script that does not, then runs ``MODULE`` as ``__main__``.
"""

from __future__ import annotations

import logging
import runpy
import sys

if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("fthsdp").setLevel(logging.INFO)
    module, sys.argv = sys.argv[1], sys.argv[1:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
