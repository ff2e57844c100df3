"""IW-OPD: per-token weights 1 + gamma(1 - cumulative |A| before t / total |A|) on full rollouts."""

from __future__ import annotations

import pytest
import torch

from adwin.config import load_config
from adwin.objectives.losses import iw_opd_weights, opd_loss


def _reference_weights(adv: list[list[float]], mask: list[list[int]], gamma: float) -> list[list[float]]:
    out = []
    for a_row, m_row in zip(adv, mask, strict=True):
        total = sum(abs(a) for a, m in zip(a_row, m_row, strict=True) if m)
        seen, row = 0.0, []
        for a, m in zip(a_row, m_row, strict=True):
            if not m:
                row.append(0.0)
                continue
            row.append(1.0 + gamma * (1.0 - (seen / total if total > 0 else 0.0)))
            seen += abs(a)
        out.append(row)
    return out


def test_weights_match_a_hand_written_reference() -> None:
    adv = [[9.0, 1.0, -2.0, 0.5, 3.0, 7.0], [0.0, -4.0, 4.0, 0.0, 0.0, 0.0], [5.0, 0.0, 0.0, 0.0, 0.0, 0.0]]
    mask = [[0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]]
    got = iw_opd_weights(torch.tensor(adv), torch.tensor(mask), 0.5)
    torch.testing.assert_close(got, torch.tensor(_reference_weights(adv, mask, 0.5)))
    # first counted token of a sample weighs 1 + gamma; the masked 9.0 and 7.0 never enter the sums
    assert got[0, 1].item() == pytest.approx(1.5)
    assert got[0, 4].item() == pytest.approx(1.0 + 0.5 * (1 - 3.5 / 6.5))


def test_weights_are_constants_and_ignore_nan_off_the_mask() -> None:
    adv = torch.tensor([[float("nan"), 1.0, 3.0]], requires_grad=True)
    w = iw_opd_weights(adv, torch.tensor([[0, 1, 1]]), 1.0)
    assert not w.requires_grad and torch.isfinite(w).all()
    torch.testing.assert_close(w, torch.tensor([[0.0, 2.0, 1.75]]))


def _batch(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    b, length, v = 3, 9, 7
    ids = torch.randint(0, v, (b, length), generator=g)
    mask = torch.zeros(b, length, dtype=torch.long)
    mask[0, 3:9] = 1
    mask[1, 2:6] = 1
    mask[2, 4:8] = 1
    logits = torch.randn(b, length, v, generator=g, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(b, length, generator=g, dtype=torch.float64) - 2.0
    return {"input_ids": ids, "response_mask": mask, "student_logits": logits, "teacher_logprobs": teacher}


def test_gamma_zero_reproduces_the_plain_loss_and_gradient() -> None:
    batch = _batch(0)
    plain, pm = opd_loss("reverse_kl_pg", **batch)
    (g_plain,) = torch.autograd.grad(plain, batch["student_logits"])
    iw0, m0 = opd_loss("reverse_kl_pg", **batch, iw_gamma=0.0)
    (g0,) = torch.autograd.grad(iw0, batch["student_logits"])
    assert iw0.item() == plain.item() and torch.equal(g0, g_plain)
    assert "loss/iw_weight_mean" not in m0 and m0 == pm


def test_positive_gamma_scales_each_token_by_its_weight() -> None:
    batch = _batch(1)
    loss, m = opd_loss("reverse_kl_pg", **batch, iw_gamma=0.5)
    ids, mask = batch["input_ids"], batch["response_mask"].clone().double()
    mask[:, 0] = 0
    logp = torch.log_softmax(batch["student_logits"][:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    logp = torch.nn.functional.pad(logp, (1, 0))
    adv = (batch["teacher_logprobs"] - logp).detach()
    w = torch.tensor(_reference_weights(adv.tolist(), mask.long().tolist(), 0.5), dtype=torch.float64)
    expected = (-(adv * logp) * w * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-10)
    (g,) = torch.autograd.grad(loss, batch["student_logits"])
    (g_ref,) = torch.autograd.grad(expected, batch["student_logits"])
    assert torch.allclose(g, g_ref)
    assert 1.0 <= m["loss/iw_weight_mean"] <= 1.5


def test_config_refuses_iw_gamma_with_a_distribution_loss() -> None:
    assert load_config(None, {"loss.iw_gamma": 0.5}).loss.iw_gamma == 0.5
    with pytest.raises(ValueError, match="iw_gamma"):
        load_config(None, {"loss.iw_gamma": 0.5, "loss.name": "forward_kl"})
    with pytest.raises(ValueError, match="iw_gamma"):
        opd_loss("forward_kl", **_batch(2), teacher_logits=torch.zeros(3, 9, 7, dtype=torch.float64), iw_gamma=0.5)
