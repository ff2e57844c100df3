"""``probes.backend: rollout`` on the vLLM engine (a stand-in ``vllm.LLM``, fake_vllm.py): the probe requests go
into the rollout's own ``LLM.generate`` call, each with its own ``max_tokens``, on the trainer's current weights."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from fake_vllm import HFBackedLLM, params
from trainer_fixtures import tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.decode.vllm import VLLMRollout
from adwin.loop.parts import load_parts
from adwin.loop.sampler import Sampler
from adwin.loop.trainer import train


def test_probe_requests_ride_the_rollout_call_on_the_vllm_engine(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(None, tiny_overrides(tmp_path, **{"rollout.backend": "vllm", "probes.backend": "rollout",
                                                        "steps": 4, "name": "vr"}))
    parts = load_parts(cfg)
    fake = HFBackedLLM(parts.student)
    monkeypatch.setattr(VLLMRollout, "load", staticmethod(lambda path, **kw: VLLMRollout(fake, sampling_params=params)))
    step_rollouts, evaluation_rows = Sampler.step_rollouts, Sampler.evaluation_rows
    calls = Counter[str]()

    def phase(kind: str, call):  # type: ignore[no-untyped-def]
        fake.phase = f"{kind}-{calls[kind]}"
        calls[kind] += 1
        try:
            return call()
        finally:
            fake.phase = None  # a forced round later in the step is its own call

    monkeypatch.setattr(Sampler, "step_rollouts", lambda self, *a: phase("rollout", lambda: step_rollouts(self, *a)))
    monkeypatch.setattr(Sampler, "evaluation_rows", lambda self, *a: phase("eval", lambda: evaluation_rows(self, *a)))
    res = train(cfg, Controller(), parts)
    rows = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    per_call = Counter(r.phase for r in fake.requests if str(r.phase).startswith("rollout"))
    assert per_call["rollout-0"] == rows  # nothing parked before the first step
    assert any(k > rows for k in per_call.values()), "probe requests joined a rollout call"
    assert sum(per_call.values()) - rows * cfg.steps == sum(r.get("probe/rider_rows", 0) for r in res.history)
    assert all(r.weights_match for r in fake.requests)
