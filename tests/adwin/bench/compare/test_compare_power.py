"""The power each suite goal states (``adwin.bench.compare.power``): a difference of the stated size is resolved
as often as it says, and numbers without a spread say they have none."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adwin.bench.compare import power
from adwin.bench.compare.tasks import Z95


def test_a_mean_off_by_its_stated_mde_is_resolved_on_four_runs_of_five() -> None:
    rng = np.random.default_rng(0)
    n, sims = 40, 4000
    ref = rng.normal(0.0, 1.0, n)  # (n,)
    mde = power.of_mean(list((ref - ref.mean()) / ref.std(ddof=1)))["mde80"]  # at the runs' true spread, 1
    resolved = 0
    for _ in range(sims):
        x = rng.normal(mde, 1.0, n)  # (n,)
        p = power.of_mean(list(x))
        resolved += x.mean() - p["halfwidth"] > 0  # the interval excludes no difference
    assert resolved / sims == pytest.approx(0.80, abs=0.04)


def test_a_share_above_its_bound_by_the_stated_mde_is_resolved_on_four_runs_of_five() -> None:
    rng = np.random.default_rng(1)
    bound, n = 0.10, 400
    p = power.of_share(bound, n)
    counts = rng.binomial(n, bound + p["mde80"], size=4000)  # (sims,)
    resolved = (counts / n - bound > p["halfwidth"]).mean()
    assert resolved == pytest.approx(0.80, abs=0.06)


def test_a_ratio_of_means_takes_both_spreads_and_one_seed_has_none() -> None:
    a, b = {"mean": 2.0, "std": 0.2, "n": 4}, {"mean": 4.0, "std": 0.4, "n": 4}
    both = power.of_ratio(a, b)["halfwidth"]
    one = power.of_ratio(a, {"mean": 4.0, "std": 0.0, "n": 4})["halfwidth"]
    assert both == pytest.approx(math.sqrt(2) * one) and one == pytest.approx(Z95 * 0.5 * 0.1 / 2)
    assert math.isnan(power.of_ratio(a, {"mean": 4.0, "std": 0.0, "n": 1})["halfwidth"])
    assert power.text(power.of_ratio(a, {"mean": 4.0, "std": 0.0, "n": 1})).startswith("no spread")
    assert power.text(power.from_halfwidth(0.02)) == f"±0.020 (80 %: {0.02 * power.MDE_FACTOR:.3f})"
