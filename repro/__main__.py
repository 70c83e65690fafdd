"""`python -m repro` is `cluster-repro`."""

import sys

from repro.cli import main

sys.exit(main())
