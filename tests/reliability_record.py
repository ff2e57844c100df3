"""Measured figures of the reliability tests for docs/reliability.md.

With ``ADWIN_RELIABILITY_RECORD=path.jsonl`` set, each reliability test appends one JSON line
``{"test": name, **figures}`` computed from what it just asserted; unset, nothing is written. The doc's
numbers come from such a run (the command is in docs/reliability.md).
"""

from __future__ import annotations

import json
import os
from typing import Any


def record(name: str, figures: dict[str, Any]) -> None:
    path = os.environ.get("ADWIN_RELIABILITY_RECORD")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps({"test": name, **figures}) + "\n")
