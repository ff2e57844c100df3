"""Seeded outputs of every student decoder, pinned before they shared one token sampler (``adwin.decode``).

The pins (``parity_pins.json``) were recorded with the three samplers the tree had before: the compacting
evaluator's ``_sampler`` (global RNG, or per-row seeds), ``rollout.generate``'s per-row ``SeededSampling`` and
transformers' own sampler, and the AsyncOPD engine's ``behavior_sample``. A decoder that moves onto the one
sampler must give the same tokens for the same seeds; docs/decisions.md, "One decode engine".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.decode.generate import generate
from adwin.sampling.compact import generate_compacting
from adwin.sampling.seeding import row_seed
from adwin.trainer_adapters.asyncopd.engine import HFRolloutEngine
from adwin.trainer_adapters.asyncopd.items import StreamItem

PINS = json.loads((Path(__file__).parent / "parity_pins.json").read_text())
CONTEXTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8], [1, 10, 11]]
SEEDS = [row_seed(0, "rollout", 3, i) for i in range(len(CONTEXTS))]
KWS = {"plain": {}, "tempered": {"temperature": 0.8, "top_p": 0.9}}
# the AsyncOPD scenario of tests/trainer_adapters/test_asyncopd_engine.py: requests join and leave at other steps
PROMPTS = [[1, 5, 9], [1, 7], [1, 3, 4, 5, 6, 8], [1, 11, 12, 13], [1, 20], [1, 30, 31, 32, 33]]
JOINS = [0, 0, 2, 3, 3, 6]
LENGTHS = [9, 4, 7, 12, 3, 5]


def drive(engine: HFRolloutEngine, steps: int = 16) -> list[StreamItem]:
    reqs = [StreamItem(f"r{i}", i, f"p{i}", p, "default", n, n, False, 0)
            for i, (p, n) in enumerate(zip(PROMPTS, LENGTHS, strict=True))]
    active: list[StreamItem] = []
    for step in range(steps):
        active += [r for r, j in zip(reqs, JOINS, strict=True) if j == step]
        for it, out in zip(active, engine.step(active) if active else [], strict=True):
            if out is not None:
                it.append(out, engine.version)
                if out.eos or it.response_len >= it.max_tokens:
                    it.finish_reason = "eos" if out.eos else "window"
        active = [it for it in active if it.finish_reason is None]
    return reqs


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return make_tiny_llama(vocab_size=64, seed=0)


@pytest.mark.parametrize("name", sorted(KWS))
def test_rollout_generate_keeps_its_seeded_tokens(model, name: str) -> None:
    kw = KWS[name]
    seeded = generate(model, CONTEXTS, [12] * len(CONTEXTS), eos={2}, pad_id=0, row_seeds=SEEDS, **kw)
    assert seeded.response_ids == PINS[f"generate_seeded_{name}"]
    torch.manual_seed(5)
    batch = generate(model, CONTEXTS, [12] * len(CONTEXTS), eos={2}, pad_id=0, **kw)
    assert batch.response_ids == PINS[f"generate_global_{name}"]


@pytest.mark.parametrize("name", sorted(KWS))
def test_compacting_evaluator_keeps_its_seeded_tokens(model, name: str) -> None:
    kw = KWS[name]
    seeded = generate_compacting(model, CONTEXTS, 12, eos={2}, pad_id=0, row_seeds=SEEDS, **kw)
    assert seeded.response_ids == PINS[f"compact_seeded_{name}"]
    torch.manual_seed(5)
    batch = generate_compacting(model, CONTEXTS, 12, eos={2}, pad_id=0, **kw)
    assert batch.response_ids == PINS[f"compact_global_{name}"]


@pytest.mark.parametrize(("m", "top_p", "temperature"), [(0, 1.0, 1.0), (2, 0.8, 1.3)])
def test_asyncopd_engine_keeps_its_seeded_tokens_logprobs_and_mc_actions(m: int, top_p: float,
                                                                          temperature: float) -> None:
    reqs = drive(HFRolloutEngine(make_tiny_llama(seed=4), eos={2}, pad_id=0, temperature=temperature, top_p=top_p,
                                 mc_samples=m, seed=11))
    pin = PINS[f"engine_m{m}"]
    assert [r.tokens for r in reqs] == pin["tokens"]
    assert [r.mc_actions for r in reqs] == pin["mc_actions"]
    for got, want in zip([r.logprobs for r in reqs], pin["logprobs"], strict=True):
        assert got == pytest.approx(want, abs=1e-5)
