"""OAPL's math (Ritter et al. eqs. 1-3), checked against the paper's closed forms, not the implementation.

A tabular bandit has arms with known rewards and a fixed inference policy ``pi_inf``; the optimum of the
KL-regularised problem is ``pi* ∝ pi_inf exp(r / beta)`` and ``V* = beta ln E_{pi_inf} exp(r / beta)``.
The policy under training is ``softmax(theta)`` over the arms.
"""

from __future__ import annotations

import math

import pytest
import torch

from adwin.objectives.oapl import oapl_loss, sequence_logprob, soft_value, teacher_return

PI_INF = [0.4, 0.3, 0.2, 0.1]  # rational: a group of 10 with counts 4, 3, 2, 1 is pi_inf exactly
REWARDS = [0.0, 1.0, 0.5, 1.0]


def optimum(beta: float) -> list[float]:
    """pi*(a) = pi_inf(a) exp(r(a)/beta) / Z, written out."""
    w = [p * math.exp(r / beta) for p, r in zip(PI_INF, REWARDS, strict=True)]
    z = sum(w)
    return [x / z for x in w]


def v_star(beta: float) -> float:
    return beta * math.log(sum(p * math.exp(r / beta) for p, r in zip(PI_INF, REWARDS, strict=True)))


def minimise(loss_fn, steps: int = 200) -> torch.Tensor:
    """LBFGS over the logits of softmax(theta), float64; returns the policy's probabilities."""
    theta = torch.zeros(len(PI_INF), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([theta], lr=1.0, max_iter=steps, tolerance_grad=1e-14, tolerance_change=1e-16,
                            line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn(torch.log_softmax(theta, dim=0))
        loss.backward()
        return loss

    opt.step(closure)
    return torch.softmax(theta.detach(), dim=0)


@pytest.mark.parametrize("beta", [0.3, 1.0, 4.0])
@pytest.mark.parametrize("counts", [[1, 1, 1, 1], [1, 1, 1, 7], [9, 1, 3, 2]], ids=["uniform", "last", "first"])
def test_minimising_eq3_with_the_exact_value_recovers_pi_star_for_any_sampling_distribution(
        beta: float, counts: list[int]) -> None:
    # V from eq. 2 on a group that *is* pi_inf (counts 4, 3, 2, 1 of 10): exactly V*
    inf_group = torch.tensor(sum(([r] * c for r, c in zip(REWARDS, (4, 3, 2, 1), strict=True)), []),
                             dtype=torch.float64)
    v = soft_value(inf_group, torch.zeros(10, dtype=torch.long), beta)
    assert torch.allclose(v, torch.full((10,), v_star(beta), dtype=torch.float64), atol=1e-12)
    # the sequences the loss is evaluated on come from another distribution: arm a, counts[a] times
    arms = torch.tensor(sum(([a] * c for a, c in enumerate(counts)), []))
    r = torch.tensor(REWARDS, dtype=torch.float64)[arms]
    inf_lp = torch.tensor(PI_INF, dtype=torch.float64).log()[arms]
    values = torch.full_like(r, float(v[0]))

    def loss_fn(logpi: torch.Tensor) -> torch.Tensor:
        return oapl_loss(logpi[arms], inf_lp, r, torch.zeros_like(arms), beta=beta, values=values)[0]

    pi = minimise(loss_fn)
    assert pi.tolist() == pytest.approx(optimum(beta), abs=1e-6)


def test_minimising_eq3_on_sampled_groups_approaches_pi_star() -> None:
    """End to end with eq. 2's own estimate: groups of G draws from pi_inf; V-hat converges as G grows."""
    beta, n_groups, G = 0.5, 8, 4096
    gen = torch.Generator().manual_seed(0)
    arms = torch.multinomial(torch.tensor(PI_INF), n_groups * G, replacement=True, generator=gen)  # (N,)
    groups = torch.arange(n_groups).repeat_interleave(G)
    r = torch.tensor(REWARDS, dtype=torch.float64)[arms]
    inf_lp = torch.tensor(PI_INF, dtype=torch.float64).log()[arms]
    pi = minimise(lambda logpi: oapl_loss(logpi[arms], inf_lp, r, groups, beta=beta)[0])
    assert pi.tolist() == pytest.approx(optimum(beta), abs=0.02)
    far = minimise(lambda logpi: oapl_loss(logpi[arms], inf_lp, r, groups, beta=4 * beta)[0])
    assert max(abs(a - b) for a, b in zip(far.tolist(), optimum(beta), strict=True)) > 0.05, \
        "the test must be able to tell two betas apart"


def test_value_is_the_max_as_beta_goes_to_zero_and_the_mean_as_beta_goes_to_infinity() -> None:
    r = torch.tensor([0.0, 1.0, 0.25, 1.0, 0.5])
    g = torch.zeros(5, dtype=torch.long)
    for beta in (1e-3, 1e-9, 1e-300):  # exp(1 / beta) overflows any float: a naive logsumexp fails
        v = soft_value(r, g, beta)
        assert torch.isfinite(v).all()
        assert v[0].item() == pytest.approx(1.0 + beta * math.log(2 / 5), abs=1e-6)  # -> max r
    for beta in (1e7, 1e9, 1e12):  # V - mean r = Var(r) / (2 beta) + O(beta^-2)
        assert soft_value(r, g, beta)[0].item() == pytest.approx(0.55, abs=1e-6)  # -> mean r
    beta = 0.7  # and in between, eq. 2 as written (float64 in, float64 out)
    assert soft_value(r.double(), g, beta)[0].item() == pytest.approx(
        beta * math.log(sum(math.exp(x / beta) for x in r.tolist()) / 5), rel=1e-12)
    huge = soft_value(torch.tensor([1000.0, 990.0], dtype=torch.float64), torch.zeros(2, dtype=torch.long), 1e-3)
    assert huge[0].item() == pytest.approx(1000.0 + 1e-3 * math.log(0.5), abs=1e-9)


def test_each_group_has_its_own_value_whatever_the_order() -> None:
    r = torch.tensor([0.0, 3.0, 1.0, 1.0, 2.0, 5.0], dtype=torch.float64)
    g = torch.tensor([7, 2, 7, 2, 7, 2])  # two interleaved groups with arbitrary ids
    beta = 0.5
    alone = {k: beta * math.log(sum(math.exp(x / beta) for x, gg in zip(r.tolist(), g.tolist(), strict=True)
                                    if gg == k) / 3) for k in (7, 2)}
    v = soft_value(r, g, beta)
    assert v.tolist() == pytest.approx([alone[k] for k in g.tolist()], rel=1e-12)
    perm = torch.tensor([5, 0, 3, 1, 4, 2])
    assert soft_value(r[perm], g[perm], beta).tolist() == pytest.approx(v[perm].tolist(), rel=1e-12)
    single = soft_value(torch.tensor([4.0]), torch.tensor([0]), beta)
    assert single.item() == pytest.approx(4.0)  # a group of one: V = r, advantage 0


def test_advantage_is_reward_minus_group_value_and_the_gradient_is_the_squared_residuals() -> None:
    logp = torch.tensor([-2.0, -1.0, -3.0], dtype=torch.float64, requires_grad=True)
    inf_lp = torch.tensor([-2.5, -1.0, -2.0], dtype=torch.float64)
    r = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1])
    beta = 2.0
    loss, terms = oapl_loss(logp, inf_lp, r, groups, beta=beta)
    v0 = beta * math.log((math.exp(1.0 / beta) + 1.0) / 2)
    adv = [1.0 - v0, 0.0 - v0, 0.0]  # the second group has one member: V = r
    res = [beta * 0.5 - adv[0], beta * 0.0 - adv[1], beta * -1.0 - adv[2]]
    assert terms.advantages.tolist() == pytest.approx(adv)
    assert loss.item() == pytest.approx(sum(x * x for x in res) / 3)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([2 * beta * x / 3 for x in res])


def test_sequence_sums_stay_inside_the_window_mask_and_ignore_padding_garbage() -> None:
    lp = torch.tensor([[0.0, -1.0, -2.0, float("nan")], [0.0, -0.5, float("-inf"), -4.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    assert sequence_logprob(lp, mask).tolist() == [-3.0, -4.5]
    teacher = torch.tensor([[0.0, -2.0, -2.0, 9.0], [0.0, -1.0, 7.0, -4.0]])
    assert teacher_return(teacher, lp, mask).tolist() == [-1.0, -0.5]


def test_invalid_betas_and_shapes_are_refused() -> None:
    r, g = torch.zeros(2), torch.zeros(2, dtype=torch.long)
    for beta in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="beta"):
            soft_value(r, g, beta)
    with pytest.raises(ValueError, match="rewards must be finite"):
        soft_value(torch.tensor([0.0, float("nan")]), g, 1.0)
    with pytest.raises(ValueError, match=r"\(N,\)"):
        oapl_loss(torch.zeros(2), torch.zeros(3), r, g, beta=1.0)
