"""`python -m coordinator [flags]` is `fthsdp coordinator [flags]`."""

import sys

from coordinator.cli import main

sys.exit(main(["coordinator", *sys.argv[1:]]))
