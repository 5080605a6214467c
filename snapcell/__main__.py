"""``python -m snapcell``: the command line."""

import sys

from snapcell.cli import main

sys.exit(main())
