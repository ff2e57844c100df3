"""Rebuild the built-in models that ship with adwin (``adwin/tasks/builtin_models``): every built-in task's
default profile at seed 0, prepared from its recipe into a fresh cache, then written as shipped folders.

Run it after any change to a recipe (a profile, the task format, an SFT schedule): the shipped models carry the
recipe's fingerprint, and a folder of another recipe is never served (the test suite fails until they are rebuilt).
It takes the preparation's time of all five tasks (tens of minutes on two cores), and its weights follow this
machine's CPU: the shipped meta records the capability and torch version that built them.

    python docs/scripts/ship_builtin_models.py [--home DIR] [--tasks chain,chain-long]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from adwin.tasks.assets import ensure_prepared, load_assets
from adwin.tasks.shipped import SHIPPED_DIR, ship, shipped_root, weights_id
from adwin.tasks.suite import TASK_NAMES


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--home", default=None, help="cache to prepare into (default: a new temporary folder, so "
                   "nothing cached by an older recipe is reused)")
    p.add_argument("--tasks", default=",".join(TASK_NAMES), help="comma-separated built-in tasks")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    home = Path(args.home) if args.home else Path(tempfile.mkdtemp(prefix="adwin-ship-"))
    SHIPPED_DIR.mkdir(exist_ok=True)
    for task in [t for t in args.tasks.split(",") if t]:
        dest = ship(ensure_prepared(home=home, profile="default", seed=0, task=task),
                    shipped_root("default", 0, task))
        size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
        logging.info("shipped %s: %.2f MB, weights %s", dest.name, size / 1e6, weights_id(load_assets(dest).meta))


if __name__ == "__main__":
    main()
