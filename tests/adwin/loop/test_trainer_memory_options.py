"""A synchronous run with every memory option on trains, audits and logs like the same run without them."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_fixtures import tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.trainer import train


def test_a_run_in_micro_batches_with_checkpointing_matches_the_plain_run(tmp_path: Path) -> None:
    runs = []
    for name, extra in (("plain", {}), ("mem", {"optim.micro_batch_size": 1, "model.gradient_checkpointing": True})):
        cfg = load_config(None, tiny_overrides(tmp_path, name=name, **{"probes.backend": "inline"}, **extra))
        runs.append(train(cfg, Controller()).history)
    plain, mem = runs
    assert [h["window/current"] for h in mem] == [h["window/current"] for h in plain]
    compared = 0
    for a, b in zip(plain, mem, strict=True):
        for k in ("loss/total", "loss/teacher_kl", "loss/tokens"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (a["step"], k)
        cosines = [k for k in a if k.startswith("audit/micro_cos_")]
        compared += len(cosines)
        for k in cosines:  # the inline audit ran in micro-batches of one probe, after checkpointed steps
            assert b[k] == pytest.approx(a[k], abs=1e-4), (a["step"], k)
    assert compared > 0
