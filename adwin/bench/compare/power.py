"""How small a difference each of the suite's goals could resolve (``adwin.bench.compare.goals``), stated beside its
verdict: a goal whose numbers cannot tell its bound from a miss says nothing, and the reader must see that.

Every goal reads a 95 % interval (``Z95``) of some number against a bound. Its power is given two ways:

* ``halfwidth``: the interval's half-width. A true difference of that size is resolved on about half of the runs
  of the suite.
* ``mde80``: the minimum detectable effect at 80 % power, ``halfwidth x (Z95 + Z80) / Z95`` (~1.43 x): the
  difference the goal resolves on 4 runs of 5. Normal approximation, so a rough figure for a bootstrap interval.

NaN where the numbers carry no spread (one seed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from adwin.bench.compare.tasks import Z95

Z80 = 0.8416212335729143  # one-sided normal quantile of 0.80
MDE_FACTOR = (Z95 + Z80) / Z95


def from_halfwidth(halfwidth: float, n: int | None = None) -> dict[str, Any]:
    """The power of an interval of half-width ``halfwidth`` over ``n`` units (problems, runs, steps)."""
    h = float(halfwidth) if halfwidth is not None else math.nan
    return {"halfwidth": h, "mde80": h * MDE_FACTOR, "n": n}


def paired(diff: Mapping[str, Any] | None) -> dict[str, Any]:
    """A paired difference's power, from its bootstrap interval over problems (``bootstrap_mean_ci``)."""
    if diff is None:
        return from_halfwidth(math.nan)
    return from_halfwidth(diff["halfwidth"], diff.get("n"))


def of_mean(values: Sequence[float]) -> dict[str, Any]:
    """The power of the mean of ``values`` (one per run): ``Z95`` standard errors."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if len(vals) < 2:
        return from_halfwidth(math.nan, len(vals))
    mean = sum(vals) / len(vals)
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
    return from_halfwidth(Z95 * sd / math.sqrt(len(vals)), len(vals))


def of_ratio(num: Mapping[str, float], den: Mapping[str, float]) -> dict[str, Any]:
    """The power of a ratio of two means over seeds (``stats.mean_std`` entries: mean, std, n), by the delta
    method: the two methods' seeds are taken as independent."""
    terms = []
    for s in (num, den):
        n, mean, sd = int(s.get("n", 0)), float(s.get("mean", math.nan)), float(s.get("std", math.nan))
        if n < 2 or not (math.isfinite(mean) and math.isfinite(sd)) or mean == 0:
            return from_halfwidth(math.nan, min(int(num.get("n", 0)), int(den.get("n", 0))))
        terms.append((sd / mean) ** 2 / n)
    ratio = float(num["mean"]) / float(den["mean"])
    return from_halfwidth(Z95 * abs(ratio) * math.sqrt(sum(terms)), min(int(num["n"]), int(den["n"])))


def of_share(bound: float, n: int) -> dict[str, Any]:
    """The power of a share of ``n`` binary outcomes against ``bound`` (binomial, at the bound). Outcomes that are
    not independent (the steps of one run) resolve less than this says."""
    if n < 1:
        return from_halfwidth(math.nan, n)
    return from_halfwidth(Z95 * math.sqrt(bound * (1 - bound) / n), n)


def text(p: Mapping[str, Any]) -> str:
    """``±half-width (80 %: mde)``, or why there is none."""
    h = p.get("halfwidth", math.nan)
    if h is None or not math.isfinite(h):
        return "no spread to resolve with (one seed or none)"
    return f"±{h:.3f} (80 %: {p['mde80']:.3f})"
