"""``python -m adwin.bench.decode``: the compiled-against-eager decode measurement runs and reports both paths; ``--long``
times the lean CPU step beside transformers' generate."""

from __future__ import annotations

import json

import pytest
from tiny_models import make_tiny_llama

from adwin.bench.decode import llama_125m_shaped, long_shaped, main, measure, measure_lean


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


def test_the_long_bench_times_the_lean_step_beside_transformers_generate_on_the_same_rows() -> None:
    row = measure_lean(make_tiny_llama(seed=4), rows=3, new=4, repeats=1)
    assert row["same_tokens"] is True
    assert row["ms_step_lean"] > 0 and row["ms_step_generate"] > 0 and row["ms_step_own_cache"] > 0
    assert abs(row["lean_over_generate"] - row["ms_step_lean"] / row["ms_step_generate"]) < 0.01


def test_the_long_option_prints_the_lean_step_against_generate(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--long", "--rows", "2", "--new", "3", "--repeats", "1"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["model"] == "long-shaped-random-weights" and row["params"] == 266_112
    assert row["new_tokens"] == 3 and row["rows"] == 2 and row["same_tokens"] is True


def test_the_long_shaped_model_has_the_built_in_long_models_size() -> None:
    m = long_shaped()
    assert sum(p.numel() for p in m.parameters()) == 266_112
    assert (m.config.hidden_size, m.config.num_hidden_layers) == (64, 4)
