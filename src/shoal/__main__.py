"""`python -m shoal` is the `shoal` command."""

from shoal.cli import run

run()
