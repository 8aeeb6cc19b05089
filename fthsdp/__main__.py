"""`python -m fthsdp ARGS` is the `fthsdp ARGS` command."""

import sys

from fthsdp.cli.main import main

sys.exit(main())
