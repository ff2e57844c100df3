"""The built-in tasks' responses written from the task statements, not from the generators' helpers: the
independent implementation the task tests compare the generators with."""

from __future__ import annotations


def reference_response(route: str, x: int, a: int, b: int, n: int, counter_digits: int = 2,
                       closing: bool = False) -> str:
    """``n`` chain lines counting down with a ``counter_digits``-wide counter, then the answer; with
    ``closing``, chain-late's closing line (the last line's input plus its result) before it."""
    lines = []
    start = x
    for k in range(n, 0, -1):
        start = x
        if route == "muladd":
            p = x * a % 10
            q = (p + b) % 10
            lines.append(f"{k:0{counter_digits}d}:{x}*{a}={p}+{b}={q}")
        else:
            p = (x - a) % 10
            q = p * b % 10
            lines.append(f"{k:0{counter_digits}d}:{x}-{a}={p}*{b}={q}")
        x = q
    if not closing:
        return "\n".join(lines) + f"\nans={x}"
    total = (start + x) % 10  # the last line's input plus its result
    return "\n".join(lines) + f"\nfin:{start}+{x}={total}\nans={total}"
