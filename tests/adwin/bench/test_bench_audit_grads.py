"""``python -m adwin.bench.audit_grads``: both engines timed on the same pool, and their Grams agree."""

from __future__ import annotations

from adwin.bench.audit_grads import measure


def test_the_bench_times_both_engines_and_their_per_sample_grams_agree() -> None:
    row = measure(rows=3, response=40, repeats=1)
    assert row["s_per_sample_row"] > 0 and row["s_per_sample_batched"] > 0
    assert abs(row["row_over_batched"] - row["s_per_sample_row"] / row["s_per_sample_batched"]) < 0.05
    assert row["max_rel_gram_gap"] < 1e-4  # float32 rounding apart
