"""Token ledger: the full-rollout estimate never counts a sample as shorter than what was generated."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from adwin.loop.accounting import TokenLedger


def _batch(lengths: list[int], finished: list[bool]) -> SimpleNamespace:
    return SimpleNamespace(response_ids=[[1] * n for n in lengths], finished=finished)


def test_truncated_samples_count_the_mean_completed_probe_length_above_the_window() -> None:
    ledger = TokenLedger(max_len=64)
    ledger.add_completed(30)
    ledger.add_completed(40)  # mean 35
    m = ledger.record(_batch([8, 8, 20], [False, False, True]), window=8, probe_tokens_total=0)  # type: ignore[arg-type]
    assert m["rollout/sync_tokens"] == 36
    assert m["rollout/full_equiv_tokens"] == 35 + 35 + 20
    m = ledger.record(_batch([8], [False]), window=48, probe_tokens_total=0)  # type: ignore[arg-type]
    assert m["rollout/full_equiv_tokens"] == 64  # no probe longer than the window: the horizon bounds it


def test_a_sample_cut_at_an_earlier_longer_window_counts_at_least_its_own_length() -> None:
    """A streaming scheduler's update can hold samples cut at a longer window than the current one: the
    estimate must not fall below what was generated (it once did: full 92 < sync 93)."""
    ledger = TokenLedger(max_len=64)
    ledger.add_completed(10)  # mean of completed probes: 10
    m = ledger.record(_batch([16, 8], [False, False]), window=8, probe_tokens_total=0)  # type: ignore[arg-type]
    assert m["rollout/full_equiv_tokens"] == 16 + 10
    assert m["rollout/full_equiv_tokens"] >= m["rollout/sync_tokens"]


def test_a_cut_sample_counts_the_mean_of_the_probes_longer_than_its_window() -> None:
    """A streaming scheduler's probes are fresh requests: many end before the window. Their plain mean
    (here 83, below the window 128) once counted every cut sample at its own length: full == sync."""
    ledger = TokenLedger(max_len=320)
    for n in (20, 30, 200):
        ledger.add_completed(n)
    m = ledger.record(_batch([128, 50], [False, True]), window=128, probe_tokens_total=0)  # type: ignore[arg-type]
    assert m["rollout/full_equiv_tokens"] == 200 + 50
    assert m["rollout/full_equiv_tokens"] > m["rollout/sync_tokens"]


def test_each_sample_is_estimated_at_the_window_it_was_cut_at() -> None:
    ledger = TokenLedger(max_len=64)
    for n in (10, 20, 40):
        ledger.add_completed(n)
    m = ledger.record(_batch([8, 32], [False, False]), window=8, probe_tokens_total=0,  # type: ignore[arg-type]
                      windows=[8, 32])
    assert m["rollout/full_equiv_tokens"] == (10 + 20 + 40) / 3 + 40  # 32's only longer probe: 40


@settings(max_examples=200, deadline=None)
@given(max_len=st.integers(2, 400), data=st.data())
def test_a_window_below_the_horizon_that_cut_a_sample_estimates_more_than_was_generated(max_len: int, data) -> None:
    """Whatever the probes' lengths, a step in which some sample was cut by a window below the horizon
    estimates more full-rollout tokens than its sync tokens; a step without a cut estimates exactly them."""
    ledger = TokenLedger(max_len=max_len)
    for n in data.draw(st.lists(st.integers(1, max_len), max_size=30)):
        ledger.add_completed(n)
    windows = data.draw(st.lists(st.integers(1, max_len - 1), min_size=1, max_size=8))
    cut = data.draw(st.lists(st.booleans(), min_size=len(windows), max_size=len(windows)))
    # a cut sample has exactly its window's length; a finished one any length up to it
    lens = [w if c else data.draw(st.integers(1, w)) for w, c in zip(windows, cut, strict=True)]
    m = ledger.record(_batch(lens, [not c for c in cut]), window=windows[0], probe_tokens_total=0,  # type: ignore[arg-type]
                      windows=windows)
    if any(cut):
        assert m["rollout/full_equiv_tokens"] > m["rollout/sync_tokens"]
    else:
        assert m["rollout/full_equiv_tokens"] == m["rollout/sync_tokens"]
