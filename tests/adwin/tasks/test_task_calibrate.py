"""The teacher's logit scale: the likelihood fit recovers a known temperature, and the scale goes into the model."""

from __future__ import annotations

import pytest
import torch

from adwin.tasks.calibrate import apply_logit_scale, calibrate_teacher, fit_logit_scale
from adwin.tasks.profiles import PROFILE_SPECS
from adwin.tasks.suite import get_task
from adwin.tasks.tokenizer import build_tokenizer


@pytest.mark.parametrize("true_scale", [0.5, 1.0, 2.5])
def test_the_fit_recovers_the_scale_the_targets_were_drawn_at(true_scale: float) -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(20_000, 12, generator=gen) * 2  # (N, V)
    targets = torch.multinomial(torch.softmax(true_scale * logits, -1), 1, generator=gen).squeeze(1)  # (N,)
    fit = fit_logit_scale(logits, targets)
    assert fit["scale"] == pytest.approx(true_scale, rel=0.05)
    assert fit["nll_after"] <= fit["nll_before"]
    assert fit["tokens"] == 20_000


def test_wrong_argmaxes_pull_the_scale_down() -> None:
    logits = torch.tensor([[3.0, 0.0, 0.0]] * 100)  # (N, V): always sure of token 0
    right = fit_logit_scale(logits, torch.zeros(100, dtype=torch.long))
    some_wrong = fit_logit_scale(logits, torch.tensor([0] * 90 + [1] * 10))
    assert some_wrong["scale"] < 1.0 < right["scale"]
    assert some_wrong["argmax_error"] == pytest.approx(0.1) and right["argmax_error"] == 0.0


def test_the_scale_multiplies_every_logit_of_a_tied_llama() -> None:
    tokenizer = build_tokenizer()
    model = PROFILE_SPECS["tiny"].model.build(len(tokenizer), tokenizer, seed=0).eval()
    assert model.config.tie_word_embeddings
    ids = torch.tensor([tokenizer("muladd x=4 a=3 b=5 n=3\n")["input_ids"]])  # (1, T)
    with torch.no_grad():
        before = model(input_ids=ids).logits  # (1, T, V)
        apply_logit_scale(model, 1.7)
        after = model(input_ids=ids).logits  # (1, T, V)
    torch.testing.assert_close(after, 1.7 * before, rtol=1e-5, atol=1e-5)


def test_calibrating_a_teacher_lowers_its_reference_nll_on_train_problems() -> None:
    tokenizer = build_tokenizer()
    model = PROFILE_SPECS["tiny"].model.build(len(tokenizer), tokenizer, seed=0)
    fit = calibrate_teacher(model, tokenizer, get_task("chain"), n=2, seed=0)
    assert fit["problems"] == 2 and fit["nll_after"] <= fit["nll_before"]
    assert model.get_decoder().norm.weight.detach().mean().item() == pytest.approx(fit["scale"], rel=1e-5)
