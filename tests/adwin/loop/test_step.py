"""One synchronous step: the loss's old-to-current ratio settings (loss.is_*, the PPO clip) reach the update."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.config import TrainConfig, load_config
from adwin.decode.generate import generate
from adwin.loop.sampler import Sampler
from adwin.loop.step import TeacherSignal, optimize
from adwin.objectives.losses import token_logprobs
from adwin.sampling.batch import Batch
from adwin.sampling.data import Prompt
from adwin.sampling.rollout import encode_prompts, layout
from adwin.student.optimizer import build_optimizer
from adwin.tasks.tokenizer import build_tokenizer

PROMPTS = [[1, 5, 6], [1, 7]]
RESPONSES = [[9, 10, 11, 2], [12, 13, 14, 15, 16]]


def _batch(behavior: list[list[float]] | None) -> Batch:
    rows = layout(PROMPTS, RESPONSES, pad_id=0)
    return Batch([Prompt(str(i), "q") for i in range(2)], PROMPTS, RESPONSES, [True, False], rows, behavior)


def _current_logprobs(model: torch.nn.Module) -> list[list[float]]:
    """The student's own logprobs of the response tokens (what an exact rollout engine records)."""
    rows = layout(PROMPTS, RESPONSES, pad_id=0)
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=rows.input_ids, attention_mask=rows.attention_mask).logits,
                            rows.input_ids)  # (B, L)
    return [lp[b, len(p) : len(p) + len(r)].tolist() for b, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True))]


def _step(cfg: TrainConfig, behavior: list[list[float]] | None) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """One ``optimize`` call on a fresh tiny student; returns its metrics and the weights after it."""
    model = make_tiny_llama(seed=3)
    optimizer, scheduler = build_optimizer(cfg, model)
    batch = _batch(behavior(model) if callable(behavior) else behavior)
    teacher = TeacherSignal(torch.full(tuple(batch.rows.input_ids.shape), -3.0))  # (B, L)
    metrics, _ = optimize(model, optimizer, scheduler, batch, teacher, cfg, window=8)
    return metrics, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_icepop_rejects_every_token_whose_behavior_ratio_leaves_the_bounds() -> None:
    cfg = load_config(None, {"loss.is_method": "icepop", "optim.lr": 1e-2})
    before = make_tiny_llama(seed=3).state_dict()
    # behavior 10 nats below the current logprobs: rho = e^10 > is_high on every token
    metrics, after = _step(cfg, lambda m: [[x - 10.0 for x in row] for row in _current_logprobs(m)])
    assert metrics["loss/is_frac_affected"] == 1.0
    assert all(torch.equal(before[k], after[k]) for k in before)  # zero gradient: Adam moves nothing


def test_ratio_one_gives_the_on_policy_update_for_every_is_method() -> None:
    on_policy, want = _step(load_config(None, {"optim.lr": 1e-2}), None)
    for method in ("clip", "cap", "icepop"):
        metrics, got = _step(load_config(None, {"loss.is_method": method, "optim.lr": 1e-2}), _current_logprobs)
        assert metrics["loss/is_frac_affected"] == 0.0
        assert abs(metrics["loss/is_ratio_max"] - 1.0) < 1e-5
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_ppo_clip_reaches_the_sync_update() -> None:
    cfg = load_config(None, {"loss.clip_low": 0.2, "loss.clip_high": 0.2, "optim.lr": 1e-2})
    metrics, _ = _step(cfg, lambda m: [[x - 10.0 for x in row] for row in _current_logprobs(m)])
    assert metrics["loss/clip_frac"] > 0.0  # the ratio left [0.8, 1.2] wherever the advantage pushes it up


def test_weighting_without_recorded_behavior_refuses() -> None:
    with pytest.raises(ValueError, match="behavior logprobs"):
        _step(load_config(None, {"loss.is_method": "clip"}), None)


@pytest.mark.parametrize("method, recorded", [("none", False), ("icepop", True)])
def test_rollouts_record_behavior_logprobs_only_when_the_loss_weights_by_them(method: str, recorded: bool) -> None:
    cfg = load_config(None, {"loss.is_method": method, "data.max_prompt_len": 16})
    tok = build_tokenizer()
    model = make_tiny_llama(vocab_size=max(64, len(tok)), seed=4)
    gen = Sampler(SimpleNamespace(student=model, tokenizer=tok), cfg)  # type: ignore[arg-type]
    torch.manual_seed(0)
    batch = gen.roll_out([Prompt("a", "1+2="), Prompt("b", "3+4=")], 2, 6)
    assert (batch.behavior_logprobs is not None) == recorded
    if recorded:
        assert [len(x) for x in batch.behavior_logprobs] == [len(r) for r in batch.response_ids]


def test_evaluation_rollouts_decode_with_the_eval_settings() -> None:
    cfg = load_config(None, {"eval.temperature": 0.0, "data.max_prompt_len": 16})
    tok = build_tokenizer()
    gen = Sampler(SimpleNamespace(student=make_tiny_llama(vocab_size=max(64, len(tok)), seed=4), tokenizer=tok),  # type: ignore[arg-type]
                  cfg)
    prompts = [Prompt("a", "1+2="), Prompt("b", "3+4=")]
    runs = []
    for seed in range(2):
        torch.manual_seed(seed)
        runs.append(gen.roll_out(prompts, 1, 6, evaluation=True).response_ids)
    greedy = generate(gen.parts.student, encode_prompts(tok, [p.prompt for p in prompts], 16), [6, 6], eos=gen.eos,
                      pad_id=gen.pad, temperature=0.0).response_ids
    assert runs[0] == runs[1] == greedy
