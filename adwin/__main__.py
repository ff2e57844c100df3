"""``python -m adwin``: the ``adwin`` command (what ``torchrun -m adwin train ...`` runs on every rank)."""

import sys

from adwin.cli import main

if __name__ == "__main__":
    sys.exit(main())
