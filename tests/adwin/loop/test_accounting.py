"""Token ledger: the full-rollout estimate never counts a sample as shorter than what was generated."""

from __future__ import annotations

from types import SimpleNamespace

from adwin.loop.accounting import TokenLedger


def _batch(lengths: list[int], finished: list[bool]) -> SimpleNamespace:
    return SimpleNamespace(response_ids=[[1] * n for n in lengths], finished=finished)


def test_truncated_samples_count_the_mean_completed_probe_length_clamped_to_the_window() -> None:
    ledger = TokenLedger(max_len=64)
    ledger.add_completed(30)
    ledger.add_completed(40)  # mean 35
    m = ledger.record(_batch([8, 8, 20], [False, False, True]), window=8, probe_tokens_total=0)  # type: ignore[arg-type]
    assert m["rollout/sync_tokens"] == 36
    assert m["rollout/full_equiv_tokens"] == 35 + 35 + 20
    m = ledger.record(_batch([8], [False]), window=48, probe_tokens_total=0)  # type: ignore[arg-type]
    assert m["rollout/full_equiv_tokens"] == 48  # never below the window


def test_a_sample_cut_at_an_earlier_longer_window_counts_at_least_its_own_length() -> None:
    """A streaming scheduler's update can hold samples cut at a longer window than the current one: the
    estimate must not fall below what was generated (it once did: full 92 < sync 93)."""
    ledger = TokenLedger(max_len=64)
    ledger.add_completed(10)  # mean of completed probes: 10
    m = ledger.record(_batch([16, 8], [False, False]), window=8, probe_tokens_total=0)  # type: ignore[arg-type]
    assert m["rollout/full_equiv_tokens"] == 16 + 10
    assert m["rollout/full_equiv_tokens"] >= m["rollout/sync_tokens"]
