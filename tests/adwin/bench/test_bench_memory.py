"""``adwin bench memory``: a smoke run of both modes on 2 gloo ranks (tiny checkpoints), and the estimate's formula."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ddp_runs import ddp_config

from adwin.bench.memory import MODES, bytes_per_param, estimate
from adwin.cli import main


def test_bench_memory_measures_a_mode_per_rank_and_estimates_the_largest_student(tmp_path: Path, capsys) -> None:
    """One mode measured, the one that takes every branch (adapters, then shards; the others run the same code
    on other config overrides, and the test suite's time is short)."""
    pytest.importorskip("peft")
    out = tmp_path / "memory.json"
    cfg = ddp_config(tmp_path)
    assert main(["bench", "memory", "--config", str(cfg), "--modes", "lora+fsdp", "--nproc", "2", "--rows", "2",
                 "--seq", "8", "--new-tokens", "4", "--steps", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    (ranks,) = res["measured"].values()
    assert len(ranks) == 2  # one entry per rank
    for r in ranks:
        assert r["train_mb"] > 0 and r["generate_s"] > 0 and r["params"] == res["meta"]["params"]
        assert 0 < r["trainable"] < r["params"]  # the adapters train, the base is frozen
        assert r["generate_per_layer_s"] > 0  # FSDP's own per-layer decode, timed beside the gathered one
    assert set(res["estimate_b"]) == set(MODES)  # the estimate covers every mode
    ddp, fsdp, lora = res["estimate_b"]["ddp"], res["estimate_b"]["fsdp"], res["estimate_b"]["lora"]
    assert fsdp["8"] > fsdp["2"] > ddp["2"] == ddp["8"]
    assert lora["8"] == lora["1"] > 3 * ddp["1"]  # float32: 4 bytes a frozen parameter against 16 + 4
    assert "largest student" in capsys.readouterr().out


def test_the_estimate_divides_the_free_memory_by_the_bytes_per_parameter() -> None:
    ddp = bytes_per_param("ddp", 8, "float32", "off", "identity")
    assert ddp == {"resident": 16.0, "gathered": 4.0}  # weights, grads, 2 Adam moments; the audit's gradient
    fsdp = bytes_per_param("fsdp", 8, "float32", "bf16", "adam")
    assert fsdp == {"resident": 2.0, "gathered": 2 * 2.0 + 4.0}  # bf16 gather + its gradient; Adam's v, whole
    # 80 GB less 1,000 tokens x 1 MiB of activations less a 1B bf16 teacher, over 20 bytes per parameter
    assert estimate(ddp, 80.0, 1000, 1.0, 1.0, 2) == pytest.approx((80e9 - 1000 * 2**20 - 2e9) / 20 / 1e9)
    assert estimate(ddp, 1.0, 10_000, 1.0, 0.0, 2) == 0.0  # nothing left: nothing fits


def test_a_lora_student_holds_its_frozen_base_and_the_adapters_training_state() -> None:
    """Adapters (a fraction of the base) train in float32 whatever the base's dtype; the base holds weights only."""
    lora = bytes_per_param("lora", 8, "bfloat16", "off", "identity", lora_fraction=0.01)
    assert lora == pytest.approx({"resident": 2.0 + 16 * 0.01, "gathered": 4 * 0.01})  # a replica: its own copy
    sharded = bytes_per_param("lora+fsdp", 8, "float32", "bf16", "adam", lora_fraction=0.01)
    # shards of the base and the adapters' state; gathered: bf16 weights of both, the adapters' audit gradient
    # (bf16) and their Adam second moments (float32)
    assert sharded == pytest.approx({"resident": (4.0 + 16 * 0.01) / 8, "gathered": 2 * 1.01 + 2 * 0.01 + 4 * 0.01})
    assert bytes_per_param("lora+fsdp", 1, "float32", "off", "identity", 0.01) == bytes_per_param(
        "lora", 1, "float32", "off", "identity", 0.01)  # one rank holds it whole


def test_an_unknown_mode_is_refused_naming_the_known_ones(capsys) -> None:
    assert main(["bench", "memory", "--modes", "ddp,zero3"]) != 0
    err = capsys.readouterr().err
    assert "zero3" in err and "fsdp" in err


def test_a_lora_fraction_outside_0_1_is_refused_naming_the_flag(capsys) -> None:
    assert main(["bench", "memory", "--lora-fraction", "0"]) != 0
    assert "--lora-fraction must be in (0, 1]" in capsys.readouterr().err
