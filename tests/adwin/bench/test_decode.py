"""``python -m adwin.bench.decode``: the compiled-against-eager decode measurement runs and reports both paths."""

from __future__ import annotations

import pytest
from tiny_models import make_tiny_llama

from adwin.bench.decode import llama_125m_shaped, measure


@pytest.mark.slow  # compiles two shapes on CPU (inductor)
def test_the_decode_bench_times_both_decoders_eager_and_compiled() -> None:
    rows = measure(make_tiny_llama(seed=4), rows=4, new=3, repeats=1)
    assert [r["decoder"] for r in rows] == ["generate", "compact"]
    for r in rows:
        assert r["ms_step_eager"] > 0 and r["ms_step_compiled"] > 0 and r["compile_s"] >= 0
        assert r["rows"] == 4 and r["new_tokens"] == 3


def test_the_125m_wide_llama_has_smollm2_s_width() -> None:
    m = llama_125m_shaped(1)
    assert (m.config.hidden_size, m.config.num_attention_heads, m.config.num_key_value_heads) == (576, 9, 3)
