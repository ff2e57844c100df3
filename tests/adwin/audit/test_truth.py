"""adwin.audit.truth on pools whose truth is set (tests/adwin/audit/synthetic_pool.py): the population cosine,
the pure-noise reading, the noise scale and the signal z read what was put in."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_pool import synthetic_vectors

from adwin.audit import truth
from adwin.audit.estimators import cross_gram

CANDS = [64, 128, 256, 512, 1024]
TOKENS = [64, 64, 128, 256, 512, 1024]  # segments of a 2,048-token response
COS = [0.2, 0.3, 0.35, 0.5, 0.85]


def _h(n: int, signal: float, seed: int = 0, cos=COS) -> np.ndarray:
    return cross_gram(synthetic_vectors(n, cos, signal=signal, tokens=TOKENS, seed=seed))


def test_the_population_cosine_and_its_interval_cover_the_set_cosines() -> None:
    pop = truth.population_interval(_h(300, signal=np.sqrt(2048 / 4)), CANDS, n_boot=100)  # noise scale 4
    for c, want in zip(CANDS, COS, strict=True):
        point, lo, hi = pop[c]
        assert lo <= want <= hi and abs(point - want) < 0.1, (c, pop[c])


def test_the_truths_window_is_the_shortest_candidate_clearing_the_threshold_else_the_horizon() -> None:
    assert truth.truth_window(dict(zip(CANDS, COS, strict=True)), CANDS, 2048, 0.7) == 1024
    assert truth.truth_window(dict(zip(CANDS, COS, strict=True)), CANDS, 2048, 0.9) == 2048
    assert [truth.rung(w, CANDS, 2048) for w in (64, 100, 1024, 2048)] == [0, 1, 4, 5]


def test_on_pure_noise_the_batch_cosine_reads_the_noise_floor_sqrt_of_the_token_share() -> None:
    h = _h(200, signal=0.0)
    floor = truth.noise_floor(truth.per_sample_grams(h), len(CANDS))
    want = np.sqrt(np.cumsum(TOKENS)[:-1] / sum(TOKENS))
    np.testing.assert_allclose(floor, want, atol=0.03)
    read = truth.readings_at(h, CANDS, 8, threshold=0.7, draws=100, rng=np.random.default_rng(0))
    np.testing.assert_allclose([r.mean for r in read["batch"]], want, atol=0.05)
    assert abs(read["debiased"][0].mean) < 0.2  # the debiased estimator reads no alignment in noise


def test_the_noise_scale_is_the_full_noise_energy_over_the_signal() -> None:
    scale, d_eff = truth.noise_scale(_h(300, signal=np.sqrt(2048 / 6)))
    assert scale == pytest.approx(6.0, rel=0.25)
    assert d_eff > 50  # isotropic noise in 400 dimensions


def test_signal_z_is_small_on_noise_and_large_on_a_shared_direction() -> None:
    rng = np.random.default_rng(1)
    noise, signal = _h(64, 0.0, seed=2), _h(64, np.sqrt(2048 / 2), seed=3)
    z_noise = [truth.signal_z(noise[np.ix_(i, range(6), i, range(6))])
               for i in (rng.choice(64, 8, replace=False) for _ in range(200))]
    assert np.mean(np.abs(z_noise)) < 1.2 and max(z_noise) < 3.5
    i = rng.choice(64, 8, replace=False)
    assert truth.signal_z(signal[np.ix_(i, range(6), i, range(6))]) > 3


def test_the_update_view_favours_the_full_rollout_when_short_windows_are_not_aligned() -> None:
    view = truth.update_view(_h(200, signal=np.sqrt(2048 / 2)), CANDS, 32, draws=20, rng=np.random.default_rng(0))
    assert view[-1] > view[0] and view[-1] > 0.5 and len(view) == len(CANDS) + 1


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_a_pool_of_pure_noise_identifies_no_truth_and_a_shared_direction_does(seed: int) -> None:
    # pure noise: the whole pool's signal z is a standard normal draw, below 2 for these seeds; a shared direction at
    # noise scale 6 over 128 samples lies far above it
    assert not truth.identifiable(_h(128, 0.0, seed=seed))
    assert truth.identifiable(_h(128, np.sqrt(2048 / 6), seed=seed))


@pytest.mark.parametrize("n", [4, 7, 128])
def test_the_split_halves_are_disjoint_cover_the_pool_and_follow_the_seed(n: int) -> None:
    t, r = truth.split_pool(n, seed=3)
    assert np.intersect1d(t, r).size == 0 and sorted([*t, *r]) == list(range(n))
    assert len(t) - len(r) in (0, 1)
    again = truth.split_pool(n, seed=3)
    assert np.array_equal(again[0], t) and np.array_equal(again[1], r)
    if n > 7:
        assert not np.array_equal(truth.split_pool(n, seed=4)[0], t)  # a random half, not the first one
        assert not np.array_equal(t, np.arange(len(t)))
    with pytest.raises(ValueError):
        truth.split_pool(3, seed=0)


def test_the_token_reading_is_the_square_root_of_the_prefix_token_share() -> None:
    lengths = np.array([100, 300, 2048])
    want = [np.sqrt(sum(min(x, c) for x in lengths) / lengths.sum()) for c in CANDS]
    np.testing.assert_allclose(truth.token_floor(lengths, CANDS), want)
    assert truth.token_floor([50, 60], CANDS)[0] == 1.0  # every response inside the shortest window
