"""What a JSON value on the wire may hold: finite numbers, UTF-8-encodable strings, bounded nesting.

Python's ``json`` accepts ``NaN``/``Infinity``, turns ``1e400`` into ``inf`` and decodes ``"\\ud800"``
into a lone surrogate; none of these can be stored and read back as JSON (``allow_nan=False``, UTF-8),
so a value holding one would commit and then break every later read. Every request model runs this
check before validation (``schemas._In``) and the write path runs it on each answer before COMMIT.
"""

from __future__ import annotations

import math
from typing import Any

# Deep enough for any real config (a few levels); far below pydantic's serializer limit and Python's
# recursion limit, so a deeper value is a clear 422 instead of a 500 on the way out.
MAX_DEPTH = 64


def json_problem(value: Any, where: str = "body", depth: int = 0, *, finite: bool = True) -> str | None:
    """Why ``value`` cannot round-trip through strict JSON (naming the place), or None.

    ``finite=False`` lets NaN/Inf through (audits: the controller records them as a fallback decision).
    """
    if depth > MAX_DEPTH:
        return f"{where}: nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, float):
        return None if not finite or math.isfinite(value) else f"{where}: non-finite number {value}"
    if isinstance(value, str):
        return None if _encodable(value) else f"{where}: string is not valid UTF-8 (lone surrogate)"
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and not _encodable(k):
                return f"{where}: key {_shown(k)} is not valid UTF-8 (lone surrogate)"
            bad = json_problem(v, f"{where}.{_shown(k)}", depth + 1, finite=finite)
            if bad:
                return bad
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            bad = json_problem(v, f"{where}[{i}]", depth + 1, finite=finite)
            if bad:
                return bad
    return None


def safe_text(text: str) -> str:
    """``text`` with lone surrogates escaped, so an error message quoting hostile input still encodes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(key: Any) -> str:
    return safe_text(str(key))[:64]
