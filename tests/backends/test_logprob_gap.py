"""Train-rollout logprob gap diagnostic (pure torch, CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from adwin.backends.logprob_gap import logprob_gap, ragged_gap


def test_gap_percentiles_are_those_of_the_absolute_differences_on_masked_tokens() -> None:
    g = torch.Generator().manual_seed(0)
    train = torch.randn(4, 30, generator=g)
    gaps = torch.rand(4, 30, generator=g)
    sign = torch.where(torch.rand(4, 30, generator=g) < 0.5, -1.0, 1.0)
    rollout = train + sign * gaps
    mask = torch.rand(4, 30, generator=g) < 0.7
    rollout[~mask] = train[~mask] + 100.0  # padding and prompt positions must never count
    out = logprob_gap(train, rollout, mask)
    kept = gaps[mask].double()
    assert out["rollout/logprob_gap_tokens"] == float(mask.sum())
    assert out["rollout/logprob_gap_max"] == pytest.approx(float(kept.max()), abs=1e-6)
    assert out["rollout/logprob_gap_mean"] == pytest.approx(float(kept.mean()), abs=1e-6)
    srt = kept.sort().values
    n = srt.numel()
    for q in (50, 90, 99):  # linear interpolation between order statistics
        pos = q / 100 * (n - 1)
        lo, hi = srt[math.floor(pos)], srt[math.ceil(pos)]
        expect = float(lo + (hi - lo) * (pos - math.floor(pos)))
        assert out[f"rollout/logprob_gap_p{q}"] == pytest.approx(expect, abs=1e-6)
    assert out["rollout/logprob_gap_p50"] <= out["rollout/logprob_gap_p90"] <= out["rollout/logprob_gap_p99"]


def test_identical_engines_have_zero_gap_and_train_side_is_detached() -> None:
    train = torch.randn(2, 5, requires_grad=True)
    out = logprob_gap(train, train.detach().clone(), torch.ones(2, 5, dtype=torch.bool))
    assert out["rollout/logprob_gap_max"] == 0.0 and out["rollout/logprob_gap_p99"] == 0.0


def test_no_response_token_reports_nothing_and_nonfinite_rollout_values_are_counted() -> None:
    assert logprob_gap(torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool)) == {}
    rollout = torch.tensor([[0.5, float("-inf"), 0.25]])
    out = logprob_gap(torch.zeros(1, 3), rollout, torch.ones(1, 3, dtype=torch.bool))
    assert out["rollout/logprob_gap_nonfinite"] == 1.0 and out["rollout/logprob_gap_tokens"] == 2.0
    assert out["rollout/logprob_gap_max"] == 0.5


def test_shape_mismatch_and_ragged_length_mismatch_raise() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        logprob_gap(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
    with pytest.raises(ValueError, match="sample 1"):
        ragged_gap([[0.0], [0.0, 1.0]], [[0.0], [0.0]])
    out = ragged_gap([[-1.0, -2.0], [-0.5]], [[-1.5, -2.0], [-0.25]])
    assert out["rollout/logprob_gap_max"] == 0.5 and out["rollout/logprob_gap_tokens"] == 3.0
