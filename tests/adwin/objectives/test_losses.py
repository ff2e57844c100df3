"""OPD estimators: closed forms, hand-written gradients, unbiasedness, masking, dispatch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import rel_entr

from adwin.objectives.losses import (
    LOSS_NAMES,
    action_logprobs,
    aggregate,
    forward_kl,
    forward_kl_topk,
    generalized_jsd,
    importance_weights,
    k1,
    k2,
    k3,
    opd_loss,
    ratio_percentiles,
    response_positions,
    reverse_kl,
    reverse_kl_mc,
    reverse_kl_pg,
    token_logprobs,
    window_mask,
)

LN2 = math.log(2.0)


def _one_step(student_row: torch.Tensor, token: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A (1, 2, V) batch whose only counted token (position 1) is ``token``, predicted by ``student_row``."""
    v = student_row.numel()
    logits = torch.stack([student_row, torch.zeros(v)])[None].clone().requires_grad_(True)  # (1, 2, V)
    ids = torch.tensor([[0, token]])
    mask = torch.tensor([[0.0, 1.0]])
    return logits, ids, mask


def _log(p: list[float]) -> torch.Tensor:
    return torch.tensor(p, dtype=torch.float64).log().float()


# ----------------------------------------------------------------------------- alignment and masks


def test_token_logprobs_reads_the_logits_one_position_earlier():
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6)
    ids = torch.randint(0, 6, (2, 4))
    out = token_logprobs(logits, ids)
    assert out.shape == (2, 4)
    assert torch.all(out[:, 0] == 0)
    for b in range(2):
        for i in range(1, 4):
            assert out[b, i] == pytest.approx(float(torch.log_softmax(logits[b, i - 1], -1)[ids[b, i]]), abs=1e-6)


def test_action_logprobs_aligns_like_token_logprobs():
    torch.manual_seed(1)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    actions = torch.stack([ids, (ids + 1) % 7, ids], dim=-1)  # (2, 5, 3)
    out = action_logprobs(logits, actions)
    assert out.shape == (2, 5, 3)
    torch.testing.assert_close(out[..., 0], token_logprobs(logits, ids))
    torch.testing.assert_close(out[..., 2], token_logprobs(logits, ids))
    torch.testing.assert_close(out[..., 1], token_logprobs(logits, (ids + 1) % 7))


def test_window_mask_counts_from_the_first_response_token():
    rm = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]])
    assert response_positions(rm).tolist() == [[-1, -1, 0, 1, 2, -1], [-1, 0, 1, 2, 3, 4]]
    assert window_mask(rm, 2).tolist() == [[0, 0, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0]]
    assert window_mask(rm, None).tolist() == rm.float().tolist()


def test_aggregation_modes_match_hand_computed_means():
    per = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert float(aggregate(per, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate(per, mask, "seq-mean-token-mean")) == pytest.approx((2.0 + 4.0) / 2)  # empty row skipped
    assert float(aggregate(per, mask, "seq-mean-token-sum")) == pytest.approx((6.0 + 4.0) / 2)
    per_nan = per.clone()
    per_nan[2] = float("nan")  # off-mask garbage never leaks
    assert float(aggregate(per_nan, mask, "token-mean")) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        aggregate(per, mask, "mean")


# ----------------------------------------------------------------------------- reverse-KL PG


def test_reverse_kl_pg_value_is_minus_advantage_times_logprob():
    # p(y) = 1/2, q(y) = 1/4: A = -log 2, loss = -A * log p = -(log 2)^2
    lp, lq = _log([0.5]).view(1, 1), _log([0.25]).view(1, 1)
    out = reverse_kl_pg(lp, lq, torch.ones(1, 1))
    assert float(out) == pytest.approx(-(LN2**2), rel=1e-6)


def test_reverse_kl_pg_gradient_is_minus_advantage_times_score():
    row = torch.tensor([0.3, -1.0, 0.8, 0.1])
    logits, ids, mask = _one_step(row, token=2)
    lq = torch.tensor([[0.0, math.log(0.4)]])
    reverse_kl_pg(token_logprobs(logits, ids), lq, mask).sum().backward()
    p = torch.softmax(row, -1)
    adv = math.log(0.4) - float(p[2].log())
    expected = -adv * (F.one_hot(torch.tensor(2), 4).float() - p)
    torch.testing.assert_close(logits.grad[0, 0], expected, rtol=1e-5, atol=1e-6)
    assert torch.all(logits.grad[0, 1] == 0)


def test_reverse_kl_pg_with_behavior_is_ratio_weighted_with_current_advantage():
    row = torch.tensor([0.5, 0.0, -0.5])
    logits, ids, mask = _one_step(row, token=0)
    p = torch.softmax(row, -1)
    lq, lb = math.log(0.2), math.log(0.6)
    out = reverse_kl_pg(token_logprobs(logits, ids), torch.tensor([[0.0, lq]]), mask,
                        behavior_logprobs=torch.tensor([[0.0, lb]]))
    rho = float(p[0]) / 0.6
    adv = lq - float(p[0].log())  # A_theta under the current student, not the behavior policy
    assert out.sum().item() == pytest.approx(-rho * adv, rel=1e-5)
    out.sum().backward()
    expected = -rho * adv * (F.one_hot(torch.tensor(0), 3).float() - p)
    torch.testing.assert_close(logits.grad[0, 0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("log_q", "log_b", "binds"),
    [
        (math.log(0.9), math.log(0.2), True),  # A > 0, rho = 2.5 > 1 + eps_high: clipped, no gradient
        (math.log(0.9), math.log(0.9), False),  # A > 0, rho < 1 - eps_low: pessimistic min keeps rho
        (math.log(0.01), math.log(0.9), True),  # A < 0, rho < 1 - eps_low: clipped
    ],
)
def test_ppo_clip_zeroes_gradient_only_when_ratio_leaves_region_in_advantage_direction(log_q, log_b, binds):
    row = torch.tensor([0.0, 0.0])  # p(y) = 1/2
    logits, ids, mask = _one_step(row, token=0)
    lp = token_logprobs(logits, ids)
    loss, metrics = opd_loss("reverse_kl_pg", student_logits=logits, input_ids=ids, response_mask=mask,
                             teacher_logprobs=torch.tensor([[0.0, log_q]]),
                             behavior_logprobs=torch.tensor([[0.0, log_b]]), clip_low=0.2, clip_high=0.28)
    loss.backward()
    rho, adv = 0.5 / math.exp(log_b), log_q - math.log(0.5)
    clipped_rho = min(max(rho, 0.8), 1.28)
    assert loss.item() == pytest.approx(max(-rho * adv, -clipped_rho * adv), rel=1e-5)
    assert metrics["loss/clip_frac"] == (1.0 if binds else 0.0)
    if binds:
        assert torch.all(logits.grad == 0)
    else:
        assert float(logits.grad.abs().sum()) > 1e-3
    assert lp.shape == (1, 2)


def test_is_methods_reweight_or_reject_tokens_as_constants():
    row = torch.tensor([0.0, 0.0])  # p(y) = 1/2; behavior 1/8 gives rho = 4
    score = torch.tensor([0.5, -0.5])  # onehot(0) - softmax
    for method, w in (("clip", 2.0), ("icepop", 0.0), ("cap", 0.0), ("none", 4.0)):
        logits, ids, mask = _one_step(row, token=0)
        out = reverse_kl_pg(token_logprobs(logits, ids), torch.tensor([[0.0, math.log(0.9)]]), mask,
                            behavior_logprobs=torch.tensor([[0.0, math.log(0.125)]]),
                            is_method=method, is_low=0.5, is_high=2.0)
        adv = math.log(0.9) - math.log(0.5)
        assert out.sum().item() == pytest.approx(-w * adv, rel=1e-5, abs=1e-7)
        out.sum().backward()
        torch.testing.assert_close(logits.grad[0, 0], -w * adv * score, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- importance weights


def test_importance_weights_methods_and_fractions():
    ratio = torch.tensor([0.2, 0.5, 1.0, 2.0, 5.0])
    expected = {
        "none": ([0.2, 0.5, 1.0, 2.0, 5.0], 0.0),
        "clip": ([0.5, 0.5, 1.0, 2.0, 2.0], 2 / 5),
        "cap": ([0.2, 0.5, 1.0, 2.0, 0.0], 1 / 5),
        "icepop": ([0.0, 0.5, 1.0, 2.0, 0.0], 2 / 5),
    }
    for method, (weights, frac) in expected.items():
        w, f = importance_weights(ratio=ratio, method=method, low=0.5, high=2.0)
        torch.testing.assert_close(w, torch.tensor(weights))
        assert f == pytest.approx(frac)
        w_log, f_log = importance_weights(ratio.log(), method, 0.5, 2.0)
        torch.testing.assert_close(w_log, torch.tensor(weights), rtol=1e-5, atol=1e-6)
        assert f_log == pytest.approx(frac)
    # the mask restricts the denominator: only [0.2, 0.5] count, one of them clipped
    _, f = importance_weights(ratio=ratio, method="clip", mask=torch.tensor([1, 1, 0, 0, 0]))
    assert f == pytest.approx(0.5)
    with pytest.raises(ValueError):
        importance_weights(ratio=ratio, method="truncate")
    with pytest.raises(ValueError):
        importance_weights(ratio.log(), ratio=ratio)
    with pytest.raises(ValueError):
        importance_weights(ratio=ratio, method="clip", low=3.0, high=2.0)


@settings(max_examples=60, deadline=None)
@given(
    ratios=st.lists(st.floats(0.0, 50.0, allow_nan=False), min_size=1, max_size=30),
    low=st.floats(0.0, 1.0),
    width=st.floats(0.0, 10.0),
)
def test_importance_weights_properties_hold_for_any_ratios(ratios, low, width):
    r = torch.tensor(ratios, dtype=torch.float64)
    high = low + width
    outside = ((r < low) | (r > high)).double().mean().item()
    w, f = importance_weights(ratio=r, method="clip", low=low, high=high)
    assert torch.all((w >= low) & (w <= high)) and f == pytest.approx(outside)
    w, f = importance_weights(ratio=r, method="icepop", low=low, high=high)
    assert torch.all((w == 0) | (w == r)) and torch.all(w[(r >= low) & (r <= high)] == r[(r >= low) & (r <= high)])
    assert f == pytest.approx(outside)
    w, f = importance_weights(ratio=r, method="cap", low=low, high=high)
    assert torch.all(w <= high) and torch.all(w[r <= high] == r[r <= high])
    assert f == pytest.approx((r > high).double().mean().item())


def test_ratio_percentiles_match_numpy_over_the_mask():
    gen = torch.Generator().manual_seed(3)
    ratio = torch.rand(4, 50, generator=gen) * 3
    mask = torch.rand(4, 50, generator=gen) > 0.3
    got = ratio_percentiles(ratio, mask)
    vals = ratio[mask].numpy()
    for key, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert got[key] == pytest.approx(float(np.percentile(vals, q)), rel=1e-5)
    assert got["max"] == pytest.approx(float(vals.max()))
    assert all(math.isnan(v) for v in ratio_percentiles(ratio, torch.zeros_like(mask)).values())


# ----------------------------------------------------------------------------- multi-sample MC


def _mc_draw_gradients(z: torch.Tensor, log_q: torch.Tensor, sample_probs: torch.Tensor, n: int, m: int,
                       *, use_behavior: bool, seed: int) -> torch.Tensor:
    """Per-draw gradients (n, V) of the MC loss wrt the logits ``z``, actions drawn from ``sample_probs``."""
    v = z.numel()
    gen = torch.Generator().manual_seed(seed)
    acts = torch.multinomial(sample_probs.expand(n, v), m, replacement=True, generator=gen)  # (n, m)
    ids = torch.stack([torch.zeros_like(acts), acts], dim=1)  # (n, 2, m)
    logits = torch.stack([z, torch.zeros(v)]).expand(n, 2, v).clone().requires_grad_(True)
    lp = action_logprobs(logits, ids)
    mask = torch.tensor([[0.0, 1.0]]).expand(n, 2)
    teacher = log_q[ids]
    behavior = sample_probs.log()[ids] if use_behavior else None
    reverse_kl_mc(lp, teacher, mask, behavior_logprobs=behavior).sum().backward()
    return logits.grad[:, 0]  # (n, V)


@pytest.mark.parametrize("off_policy", [False, True])
def test_mc_estimator_is_unbiased_for_the_dense_reverse_kl_gradient(off_policy):
    z = torch.tensor([1.0, 0.2, -0.5, 0.0, -1.5])
    q = torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15])
    p = torch.softmax(z, -1)
    # reference: d KL(p||q) / dz = p * (log p - log q - KL), by hand and by autograd of the dense loss
    kl = float((p * (p.log() - q.log())).sum())
    hand = p * (p.log() - q.log() - kl)
    zz = torch.stack([z, torch.zeros(5)])[None].clone().requires_grad_(True)
    tl = torch.stack([q.log(), torch.zeros(5)])[None]
    reverse_kl(zz, tl).sum().backward()
    torch.testing.assert_close(zz.grad[0, 0], hand, rtol=1e-5, atol=1e-6)

    sample = torch.tensor([0.3, 0.3, 0.1, 0.2, 0.1]) if off_policy else p
    n, m = 20_000, 4
    g = _mc_draw_gradients(z, q.log(), sample, n, m, use_behavior=off_policy, seed=11)
    se = g.std(dim=0) / math.sqrt(n)
    err = (g.mean(dim=0) - hand).abs()
    assert torch.all(err <= 4 * se + 1e-6), (err, se)
    if off_policy:  # the test has power: ignoring the behavior policy is visibly biased
        g_biased = _mc_draw_gradients(z, q.log(), sample, n, m, use_behavior=False, seed=11)
        err_b = (g_biased.mean(dim=0) - hand).abs()
        assert torch.any(err_b > 4 * g_biased.std(dim=0) / math.sqrt(n))


def test_mc_with_one_action_matches_the_pg_surrogate():
    torch.manual_seed(5)
    logits = torch.randn(2, 4, 6, requires_grad=True)
    ids = torch.randint(0, 6, (2, 4))
    tq, tb = torch.randn(2, 4).clamp(max=0) - 1, torch.randn(2, 4).clamp(max=0) - 1
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    mc = reverse_kl_mc(action_logprobs(logits, ids[..., None]), tq[..., None], mask, behavior_logprobs=tb[..., None])
    (g_mc,) = torch.autograd.grad(mc.sum(), logits)
    pg = reverse_kl_pg(token_logprobs(logits, ids), tq, mask, behavior_logprobs=tb)
    (g_pg,) = torch.autograd.grad(pg.sum(), logits)
    torch.testing.assert_close(mc, pg)
    torch.testing.assert_close(g_mc, g_pg)


# ----------------------------------------------------------------------------- top-k forward KL


def test_topk_forward_kl_closed_form_is_not_renormalized():
    p, q = [0.4, 0.3, 0.2, 0.1], [0.5, 0.3, 0.1, 0.1]
    logits, _, mask = _one_step(_log(p), token=0)
    ids = torch.tensor([[[0, 0], [0, 1]]])
    lq = torch.stack([torch.zeros(2), _log(q[:2])])[None]
    out = forward_kl_topk(logits, ids, lq, mask)
    expected = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.3)
    renormalized = (0.5 / 0.8) * math.log((0.5 / 0.8) / (0.4 / 0.7)) + (0.3 / 0.8) * math.log((0.3 / 0.8) / (0.3 / 0.7))
    assert out[0, 1].item() == pytest.approx(expected, rel=1e-5)
    assert abs(expected - renormalized) > 1e-2
    out.sum().backward()
    # d/dz of -sum_{v in K} q_v log p_v = -(q_K - Q_K * p)
    p_t, q_k = torch.tensor(p), torch.tensor([0.5, 0.3, 0.0, 0.0])
    torch.testing.assert_close(logits.grad[0, 0], -(q_k - q_k.sum() * p_t), rtol=1e-5, atol=1e-6)


def test_topk_forward_kl_is_clamped_at_zero():
    logits, _, mask = _one_step(_log([0.1, 0.1, 0.8]), token=0)
    ids = torch.tensor([[[0, 0], [0, 1]]])
    lq = torch.stack([torch.zeros(2), _log([0.05, 0.05])])[None]  # partial sum 0.1 * log(0.5) < 0
    out = forward_kl_topk(logits, ids, lq, mask)
    assert out.sum().item() == 0.0
    out.sum().backward()
    assert torch.all(logits.grad == 0)


def test_topk_forward_kl_uses_the_student_logits_one_position_earlier():
    torch.manual_seed(7)
    logits = torch.randn(1, 4, 5)
    t = torch.log_softmax(torch.randn(1, 4, 5), -1)
    lq, ids = t.topk(3, dim=-1)  # teacher top-k for the token at each position
    out = forward_kl_topk(logits, ids, lq, torch.tensor([[0.0, 1.0, 1.0, 1.0]]))
    for i in range(1, 4):
        s = torch.log_softmax(logits[0, i - 1], -1)
        ref = float((lq[0, i].exp() * (lq[0, i] - s[ids[0, i]])).sum().clamp_min(0))
        assert out[0, i].item() == pytest.approx(ref, rel=1e-5, abs=1e-7)


def test_topk_forward_kl_treats_unfilled_teacher_slots_as_zero_mass():
    logits, _, mask = _one_step(_log([0.4, 0.3, 0.3]), token=0)
    ids = torch.tensor([[[0, 0], [0, -1]]])
    lq = torch.tensor([[[0.0, 0.0], [math.log(0.9), -math.inf]]])
    out = forward_kl_topk(logits, ids, lq, mask)
    assert out[0, 1].item() == pytest.approx(0.9 * math.log(0.9 / 0.4), rel=1e-5)
    out.sum().backward()
    assert torch.isfinite(logits.grad).all()


# ----------------------------------------------------------------------------- dense divergences


def _np_divergence(p: np.ndarray, q: np.ndarray, beta: float) -> float:
    """Independent reference with the explicit mixture; endpoints follow TRL (0: KL(q||p), 1: KL(p||q))."""
    if beta == 0.0:
        return float(rel_entr(q, p).sum())
    if beta == 1.0:
        return float(rel_entr(p, q).sum())
    mix = beta * q + (1.0 - beta) * p
    return float(beta * rel_entr(q, mix).sum() + (1.0 - beta) * rel_entr(p, mix).sum())


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_generalized_jsd_matches_an_independent_numpy_reference(beta):
    gen = torch.Generator().manual_seed(2)
    s, t = torch.randn(2, 4, 6, generator=gen), torch.randn(2, 4, 6, generator=gen)
    out = generalized_jsd(s, t, beta).double().numpy()
    sp, tp = torch.softmax(s.double(), -1).numpy(), torch.softmax(t.double(), -1).numpy()
    for b in range(2):
        assert out[b, 0] == 0.0
        for i in range(1, 4):
            assert out[b, i] == pytest.approx(_np_divergence(sp[b, i - 1], tp[b, i - 1], beta), rel=1e-4, abs=1e-6)
    if beta == 0.0:
        torch.testing.assert_close(forward_kl(s, t), generalized_jsd(s, t, 0.0))
    if beta == 1.0:
        torch.testing.assert_close(reverse_kl(s, t), generalized_jsd(s, t, 1.0))


def test_generalized_jsd_scales_like_the_endpoint_kls_near_the_endpoints():
    gen = torch.Generator().manual_seed(4)
    s, t = torch.randn(1, 3, 5, generator=gen).double(), torch.randn(1, 3, 5, generator=gen).double()
    eps = 1e-4
    torch.testing.assert_close(generalized_jsd(s, t, eps) / eps, forward_kl(s, t).double(), rtol=1e-2, atol=1e-4)
    torch.testing.assert_close(generalized_jsd(s, t, 1 - eps) / eps, reverse_kl(s, t).double(), rtol=1e-2, atol=1e-4)
    with pytest.raises(ValueError):
        generalized_jsd(s, t, 1.5)


# ----------------------------------------------------------------------------- k estimators


def test_k_estimators_closed_forms_and_expectations():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    kl = float((p * (p / q).log()).sum())
    lp, lq = p.log(), q.log()
    torch.testing.assert_close(k1(lp, lq), (p / q).log())
    torch.testing.assert_close(k2(lp, lq), 0.5 * (p / q).log() ** 2)
    torch.testing.assert_close(k3(lp, lq), q / p - 1 - (q / p).log())
    assert float((p * k1(lp, lq)).sum()) == pytest.approx(kl)  # unbiased
    assert float((p * k3(lp, lq)).sum()) == pytest.approx(kl)  # unbiased
    assert torch.all(k3(lp, lq) >= 0) and torch.any(k1(lp, lq) < 0)
    assert abs(float((p * k2(lp, lq)).sum()) - kl) > 1e-3  # biased


def test_k2_gradient_equals_the_reverse_kl_pg_gradient():
    torch.manual_seed(8)
    logits = torch.randn(2, 5, 4, requires_grad=True)
    ids = torch.randint(0, 4, (2, 5))
    tq = torch.log_softmax(torch.randn(2, 5, 4), -1).gather(-1, ids[..., None]).squeeze(-1)
    mask = torch.tensor([[0.0, 1, 1, 1, 0], [0, 0, 1, 1, 1]])
    lp = token_logprobs(logits, ids)
    (g_k2,) = torch.autograd.grad((k2(lp, tq) * mask).sum(), logits)
    (g_pg,) = torch.autograd.grad(reverse_kl_pg(token_logprobs(logits, ids), tq, mask).sum(), logits)
    torch.testing.assert_close(g_k2, g_pg)


def test_k3_expected_gradient_is_the_forward_kl_gradient():
    z = torch.tensor([0.4, -0.3, 1.1, 0.0])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    v = z.numel()
    logits = torch.stack([z, torch.zeros(v)]).expand(v, 2, v).clone().requires_grad_(True)
    ids = torch.stack([torch.zeros(v, dtype=torch.long), torch.arange(v)], dim=1)  # draw b samples token b
    lp = token_logprobs(logits, ids)
    lq = torch.stack([torch.zeros(v), q.log()], dim=1)
    weights = torch.softmax(z, -1).detach()  # exact expectation over y ~ p
    ((k3(lp, lq)[:, 1]) * weights).sum().backward()
    expected_grad = logits.grad[:, 0].sum(0)
    zz = torch.stack([z, torch.zeros(v)])[None].clone().requires_grad_(True)
    forward_kl(zz, torch.stack([q.log(), torch.zeros(v)])[None]).sum().backward()
    torch.testing.assert_close(expected_grad, zz.grad[0, 0], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- dispatch: opd_loss


def _batch(seed: int = 0, v: int = 6, k: int = 3, m: int = 3) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    b, length = 3, 8
    response_mask = torch.tensor([
        [0, 0, 1, 1, 1, 1, 1, 0],  # prompt 2, response 5, pad 1
        [0, 1, 1, 1, 0, 0, 0, 0],  # prompt 1, response 3, pad 4
        [0, 0, 0, 1, 1, 1, 1, 1],
    ])
    t_logits = torch.randn(b, length, v, generator=gen)
    ids = torch.randint(0, v, (b, length), generator=gen)
    actions = torch.randint(0, v, (b, length, m), generator=gen)
    t_logp_full = torch.log_softmax(t_logits, -1)
    lq_top, ids_top = t_logp_full[:, :-1].topk(k, dim=-1)
    return {
        "student_logits": torch.randn(b, length, v, generator=gen),
        "input_ids": ids,
        "response_mask": response_mask,
        "teacher_logits": t_logits,
        "teacher_logprobs": token_logprobs(t_logits, ids),
        "behavior_logprobs": token_logprobs(t_logits, ids) + 0.3 * torch.randn(b, length, generator=gen),
        "teacher_topk_ids": F.pad(ids_top, (0, 0, 1, 0)),
        "teacher_topk_logprobs": F.pad(lq_top, (0, 0, 1, 0)),
        "action_ids": actions,
        "teacher_mc": action_logprobs(t_logits, actions),
        "behavior_mc": action_logprobs(t_logits, actions) + 0.3 * torch.randn(b, length, m, generator=gen),
    }


def _call(name: str, d: dict[str, torch.Tensor], logits: torch.Tensor, **kw) -> tuple[torch.Tensor, dict[str, float]]:
    args = {"student_logits": logits, "input_ids": d["input_ids"], "response_mask": d["response_mask"]}
    if name == "reverse_kl_mc":
        args.update(action_ids=d["action_ids"], teacher_logprobs=d["teacher_mc"], behavior_logprobs=d["behavior_mc"])
    elif name == "forward_kl_topk":
        args.update(teacher_topk_ids=d["teacher_topk_ids"], teacher_topk_logprobs=d["teacher_topk_logprobs"],
                    teacher_logprobs=d["teacher_logprobs"])
    elif name in ("forward_kl", "reverse_kl", "jsd"):
        args.update(teacher_logits=d["teacher_logits"])
    else:
        args.update(teacher_logprobs=d["teacher_logprobs"])
        if name == "reverse_kl_pg":
            args.update(behavior_logprobs=d["behavior_logprobs"])
    args.update(kw)
    return opd_loss(name, **args)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_opd_loss_ignores_everything_outside_the_window_and_response(name):
    d = _batch(seed=1)
    window = 2
    counted = window_mask(d["response_mask"], window).bool()  # (B, L)
    counted[:, 0] = False
    predictors = F.pad(counted[:, 1:], (0, 1))  # logits row i-1 predicts counted token i
    logits = d["student_logits"].clone().requires_grad_(True)
    loss, metrics = _call(name, d, logits, window=window)
    (grad,) = torch.autograd.grad(loss, logits)
    assert metrics["loss/tokens"] == float(counted.sum())
    assert torch.all(grad[~predictors] == 0)
    assert float(grad[predictors].abs().sum()) > 0

    # scramble every input off the counted tokens, including NaN / inf / invalid ids
    e = {key: val.clone() for key, val in d.items()}
    off, off_pred = ~counted, ~predictors
    e["input_ids"][off] = 0
    e["teacher_logprobs"][off] = float("nan")
    e["behavior_logprobs"][off] = -math.inf
    e["teacher_mc"][off] = float("nan")
    e["behavior_mc"][off] = math.inf
    e["action_ids"][off] = -1
    e["teacher_topk_ids"][off] = -1
    e["teacher_topk_logprobs"][off] = float("nan")
    e["teacher_logits"][off_pred] = float("nan")
    logits2 = d["student_logits"].clone()
    logits2[off_pred] = 100.0 * torch.randn_like(logits2[off_pred])
    logits2.requires_grad_(True)
    loss2, metrics2 = _call(name, e, logits2, window=window)
    (grad2,) = torch.autograd.grad(loss2, logits2)
    assert loss2.item() == pytest.approx(loss.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(grad2, grad, rtol=1e-4, atol=1e-6)
    assert all(math.isfinite(v) for v in metrics2.values())


def _same_teacher(name: str, d: dict[str, torch.Tensor], v: int) -> dict[str, torch.Tensor]:
    """Teacher inputs equal to the student (top-k covers the whole vocabulary)."""
    e = dict(d)
    s = d["student_logits"]
    e["teacher_logits"] = s.clone()
    e["teacher_logprobs"] = token_logprobs(s, d["input_ids"])
    e["teacher_mc"] = action_logprobs(s, d["action_ids"])
    lq, ids = torch.log_softmax(s[:, :-1], -1).topk(v, dim=-1)
    e["teacher_topk_ids"], e["teacher_topk_logprobs"] = F.pad(ids, (0, 0, 1, 0)), F.pad(lq, (0, 0, 1, 0))
    return e


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-sum"])
def test_zero_loss_and_zero_gradient_when_student_equals_teacher(name, aggregation):
    v = 6
    d = _same_teacher(name, _batch(seed=2, v=v), v)
    logits = d["student_logits"].clone().requires_grad_(True)
    loss, metrics = _call(name, d, logits, aggregation=aggregation)
    (grad,) = torch.autograd.grad(loss, logits)
    assert abs(loss.item()) < 1e-6
    assert float(grad.abs().max()) < 1e-6
    assert abs(metrics["loss/teacher_kl"]) < 1e-6


def test_opd_loss_metrics_and_aggregation_follow_the_hand_computation():
    d = _batch(seed=3)
    mask = window_mask(d["response_mask"], 3)
    mask[:, 0] = 0
    lp = token_logprobs(d["student_logits"], d["input_ids"])
    lq = d["teacher_logprobs"]
    per = -(lq - lp) * lp
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        loss, metrics = opd_loss("reverse_kl_pg", student_logits=d["student_logits"], input_ids=d["input_ids"],
                                 response_mask=d["response_mask"], teacher_logprobs=lq, window=3, aggregation=agg)
        n_seq = (mask * per).sum(1)
        manual = {"token-mean": float((mask * per).sum() / mask.sum()),
                  "seq-mean-token-mean": float((n_seq / mask.sum(1)).mean()),
                  "seq-mean-token-sum": float(n_seq.mean())}[agg]
        assert loss.item() == pytest.approx(manual, rel=1e-5)
        assert metrics["loss/value"] == pytest.approx(manual, rel=1e-5)
    assert metrics["loss/tokens"] == float(mask.sum())
    assert metrics["loss/teacher_kl"] == pytest.approx(float(((lp - lq) * mask).sum() / mask.sum()), rel=1e-5)
    # same loss from precomputed realized-token logprobs instead of logits
    loss_lp, _ = opd_loss("reverse_kl_pg", student_logprobs=lp, input_ids=d["input_ids"],
                          response_mask=d["response_mask"], teacher_logprobs=lq, window=3)
    assert loss_lp.item() == pytest.approx(float(aggregate(per, mask)), rel=1e-5)


def test_opd_loss_reports_importance_ratio_diagnostics():
    d = _batch(seed=4)
    _, metrics = _call("reverse_kl_pg", d, d["student_logits"], is_method="icepop", is_low=0.8, is_high=1.25)
    mask = d["response_mask"].clone().float()
    mask[:, 0] = 0
    ratio = (token_logprobs(d["student_logits"], d["input_ids"]) - d["behavior_logprobs"]).exp()
    outside = ((ratio < 0.8) | (ratio > 1.25)).float()
    assert metrics["loss/is_frac_affected"] == pytest.approx(float((outside * mask).sum() / mask.sum()))
    assert metrics["loss/is_ratio_max"] == pytest.approx(float(ratio[mask.bool()].max()), rel=1e-5)
    assert metrics["loss/is_ratio_p50"] <= metrics["loss/is_ratio_p90"] <= metrics["loss/is_ratio_p99"]


def test_opd_loss_rejects_missing_inputs_and_bad_options():
    d = _batch()
    base = {"student_logits": d["student_logits"], "input_ids": d["input_ids"], "response_mask": d["response_mask"]}
    with pytest.raises(ValueError, match="teacher_logits"):
        opd_loss("forward_kl", **base)
    with pytest.raises(ValueError, match="action_ids"):
        opd_loss("reverse_kl_mc", teacher_logprobs=d["teacher_mc"], **base)
    with pytest.raises(ValueError, match="loss must be one of"):
        opd_loss("k1", teacher_logprobs=d["teacher_logprobs"], **base)
    with pytest.raises(ValueError, match="clip_low"):
        opd_loss("reverse_kl_pg", teacher_logprobs=d["teacher_logprobs"], clip_low=0.2, **base)
    with pytest.raises(ValueError, match="not both"):
        opd_loss("reverse_kl_pg", teacher_logprobs=d["teacher_logprobs"], behavior_logprobs=d["behavior_logprobs"],
                 clip_low=0.2, clip_high=0.2, is_method="clip", **base)
    with pytest.raises(ValueError, match="must match"):
        opd_loss("reverse_kl", teacher_logits=d["teacher_logits"][..., :4], **base)


def test_opd_loss_reports_topk_masses_and_mc_teacher_kl():
    d = _batch(seed=5)
    mask = d["response_mask"].clone().float()
    mask[:, 0] = 0
    _, metrics = _call("forward_kl_topk", d, d["student_logits"])
    q_mass = d["teacher_topk_logprobs"].exp().sum(-1)
    p_mass = action_logprobs(d["student_logits"], d["teacher_topk_ids"]).exp().sum(-1)
    assert metrics["loss/topk_teacher_mass"] == pytest.approx(float((q_mass * mask).sum() / mask.sum()), rel=1e-5)
    assert metrics["loss/topk_student_mass"] == pytest.approx(float((p_mass * mask).sum() / mask.sum()), rel=1e-5)
    assert 0 < metrics["loss/topk_student_mass"] < 1
    _, metrics = _call("reverse_kl_mc", d, d["student_logits"])
    k1_actions = (action_logprobs(d["student_logits"], d["action_ids"]) - d["teacher_mc"]).mean(-1)
    assert metrics["loss/teacher_kl"] == pytest.approx(float((k1_actions * mask).sum() / mask.sum()), rel=1e-5)
