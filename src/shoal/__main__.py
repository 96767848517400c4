"""`python -m shoal` is the `shoal` command."""

import sys

from shoal.cli import main

sys.exit(main())
