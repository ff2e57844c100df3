"""Stale-corrected audit weights: rho = p_theta / p_behavior per probe token, its treatments and diagnostics,
and the property that matters: importance weighting moves the audit of stale probes towards the audit of
fresh probes sampled under the current weights."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from adwin.audit.alignment import ProbeBatch, audit
from adwin.audit.stale import current_logprobs, stale_token_weights

V, P, L, CANDS = 8, 2, 8, [2, 4]


class ContextFree(torch.nn.Module):
    """Logits depend on the position only. Per-token rho corrects the distribution of each token given its
    prefix, not the distribution of prefixes; on a context-free policy the two coincide, so the test isolates
    the correction the method claims (on a real LM a prefix shift remains and rho only corrects part of it)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())  # (P + L, V)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: object) -> SimpleNamespace:
        b, n = input_ids.shape
        return SimpleNamespace(logits=self.table[:n].unsqueeze(0).expand(b, n, V))  # (B, n, V)


def _probes(table: torch.Tensor, teacher: torch.Tensor, n: int, gen: torch.Generator) -> ProbeBatch:
    """``n`` complete probes sampled from ``table`` with their behavior logprobs."""
    logp = torch.log_softmax(table[P - 1 : P - 1 + L], -1)  # (L, V): predictors of the response positions
    y = torch.multinomial(logp.exp(), n, replacement=True, generator=gen).T  # (n, L)
    ids = torch.cat([torch.ones(n, P, dtype=torch.long), y], 1)  # (n, P + L)
    resp = torch.zeros_like(ids)
    resp[:, P:] = 1
    behavior = torch.zeros(ids.shape)
    behavior[:, P:] = logp.gather(1, y.T).T
    t = torch.zeros(ids.shape)
    t[:, P:] = torch.log_softmax(teacher[P - 1 : P - 1 + L], -1).gather(1, y.T).T
    return ProbeBatch(ids, torch.ones_like(ids), resp, t, behavior_logprobs=behavior)


def _errors(seed: int, method: str, low: float, high: float, n: int = 256) -> tuple[float, float]:
    """Sum over candidates of |cos(stale) - cos(fresh)| without and with importance weights."""
    g = torch.Generator().manual_seed(seed)
    new, teacher = torch.randn(P + L, V, generator=g), torch.randn(P + L, V, generator=g)
    # The old weights favoured, late in the response, the token the teacher likes least: stale probes
    # over-represent it there, which biases the late segments' gradients.
    bad = torch.log_softmax(teacher, -1).argmin(-1)  # (P + L,)
    old = new.clone()
    late = P - 1 + CANDS[-1]
    old[late:] += 3.0 * torch.nn.functional.one_hot(bad[late:], V)
    model = ContextFree(new)
    stale, fresh = _probes(old, teacher, n, g), _probes(new, teacher, 4 * n, g)
    ref = audit(model, fresh, CANDS, method="reference", macro=False).cosines
    plain = audit(model, stale, CANDS, method="reference", macro=False).cosines
    weights, _ = stale_token_weights(model, stale, method, low, high)
    assert weights is not None
    weighted = audit(model, stale, CANDS, method="reference", macro=False, token_weights=weights).cosines
    return sum(abs(plain[c] - ref[c]) for c in CANDS), sum(abs(weighted[c] - ref[c]) for c in CANDS)


@pytest.mark.parametrize(("method", "low", "high"), [("clip", 0.0, 1e3), ("icepop", 0.1, 10.0), ("cap", 0.0, 10.0)])
def test_importance_weights_bring_the_stale_audit_closer_to_a_fresh_one(method: str, low: float, high: float) -> None:
    errs = [_errors(seed, method, low, high) for seed in range(3)]
    plain = sum(e[0] for e in errs) / len(errs)
    weighted = sum(e[1] for e in errs) / len(errs)
    assert plain > 0.15  # staleness really biases the unweighted audit here (not sampling noise)
    assert weighted < 0.5 * plain


class LateShift(torch.nn.Module):
    """Stale weights of a tiny Llama: the current model plus a logit shift towards ``token`` from response
    position ``start`` on (the old student favoured, late in the response, what the teacher likes least)."""

    def __init__(self, base: torch.nn.Module, token: int, shift: float, start: int) -> None:
        super().__init__()
        self.base, self.token, self.shift, self.start = base, token, shift, start

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **_: object) -> SimpleNamespace:
        logits = self.base(input_ids=input_ids, attention_mask=attention_mask).logits.clone()  # (B, n, V)
        logits[:, self.start :, self.token] += self.shift
        return SimpleNamespace(logits=logits)


@torch.no_grad()
def _sample_llama(model: torch.nn.Module, teacher: torch.nn.Module, n: int, gen: torch.Generator) -> ProbeBatch:
    """``n`` probes of L tokens sampled token by token from ``model`` after a fixed 2-token prompt."""
    ids = torch.tensor([[1, 3]] * n)  # (n, P)
    behavior = []
    for _ in range(L):
        logp = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), -1)  # (n, V)
        y = torch.multinomial(logp.exp(), 1, generator=gen)  # (n, 1)
        behavior.append(logp.gather(1, y))
        ids = torch.cat([ids, y], 1)
    resp = torch.zeros_like(ids)
    resp[:, P:] = 1
    b = torch.zeros(ids.shape)
    b[:, P:] = torch.cat(behavior, 1)
    t = torch.zeros(ids.shape)
    t[:, 1:] = torch.log_softmax(teacher(input_ids=ids).logits.float(), -1)[:, :-1].gather(2, ids[:, 1:, None])[..., 0]
    return ProbeBatch(ids, torch.ones_like(ids), resp, t * resp, behavior_logprobs=b)


def _llama_errors(seed: int, level: str, n: int = 256) -> tuple[float, float]:
    from tiny_models import make_tiny_llama

    g = torch.Generator().manual_seed(seed)
    shape = {"vocab_size": V, "hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}
    new, teacher = make_tiny_llama(**shape, seed=seed), make_tiny_llama(**shape, seed=seed + 1000)
    with torch.no_grad():  # sharper than at init, so the policies are far from uniform and context-dependent
        new.lm_head.weight.mul_(8.0)
        teacher.lm_head.weight.mul_(8.0)
    fresh = _sample_llama(new, teacher, 4 * n, g)
    teacher_logp = torch.log_softmax(teacher(input_ids=fresh.input_ids).logits.float(), -1)  # (4n, P + L, V)
    worst = int(teacher_logp[:, P - 1 : -1].mean((0, 1)).argmin())
    stale = _sample_llama(LateShift(new, worst, 3.0, P - 1 + CANDS[-1]), teacher, n, g)
    ref = audit(new, fresh, CANDS, method="reference", macro=False).cosines
    plain = audit(new, stale, CANDS, method="reference", macro=False).cosines
    weights, _ = stale_token_weights(new, stale, "clip", 0.0, 1e3, level=level)
    weighted = audit(new, stale, CANDS, method="reference", macro=False, token_weights=weights).cosines
    return sum(abs(plain[c] - ref[c]) for c in CANDS), sum(abs(weighted[c] - ref[c]) for c in CANDS)


@pytest.mark.parametrize("level", ["token", "prefix"])
def test_importance_weights_bring_a_tiny_llamas_stale_audit_closer_to_a_fresh_one(level: str) -> None:
    errs = [_llama_errors(seed, level) for seed in range(3)]
    plain = sum(e[0] for e in errs) / len(errs)
    weighted = sum(e[1] for e in errs) / len(errs)
    assert plain > 0.3  # the stale weights really bias the unweighted audit (fresh-vs-fresh noise is ~0.1)
    assert weighted < 0.5 * plain


def test_prefix_level_weights_are_running_products_of_token_ratios(tiny_llama: torch.nn.Module) -> None:
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(2))
    resp = torch.zeros_like(ids)
    resp[:, 3:] = 1
    batch = ProbeBatch(ids, torch.ones_like(ids), resp, torch.zeros(ids.shape))
    shift = torch.zeros(ids.shape)
    shift[:, 3:] = torch.tensor([0.1, -0.2, 0.3, 0.05])
    batch.behavior_logprobs = (current_logprobs(tiny_llama, batch) - shift) * resp  # rho_t = exp(shift_t)
    w, _ = stale_token_weights(tiny_llama, batch, "clip", 0.0, 1e3, level="prefix")
    assert w is not None
    torch.testing.assert_close(w, torch.exp(torch.cumsum(shift, 1)) * resp, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="is_level"):
        stale_token_weights(tiny_llama, batch, "clip", level="sequence")


def test_ratios_are_one_when_the_behavior_policy_is_the_current_one(tiny_llama: torch.nn.Module) -> None:
    ids = torch.randint(3, 64, (3, 9), generator=torch.Generator().manual_seed(0))
    resp = torch.zeros_like(ids)
    resp[:, 4:] = 1
    batch = ProbeBatch(ids, torch.ones_like(ids), resp, torch.zeros(ids.shape))
    batch.behavior_logprobs = current_logprobs(tiny_llama, batch) * resp
    w, m = stale_token_weights(tiny_llama, batch, "clip", 0.5, 2.0)
    assert w is not None
    torch.testing.assert_close(w, resp.float())
    assert m["audit/is_p50"] == pytest.approx(1.0, abs=1e-5) and m["audit/is_max"] == pytest.approx(1.0, abs=1e-5)
    assert m["audit/is_clipped_frac"] == 0.0


def test_treatments_mask_or_clip_and_report_the_fraction(tiny_llama: torch.nn.Module) -> None:
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(1))
    resp = torch.zeros_like(ids)
    resp[:, 2:] = 1  # 8 response tokens
    versions = torch.where(resp.bool(), torch.tensor([[0, 0, 0, 0, 3, 3]] * 2), torch.full_like(ids, -1))
    batch = ProbeBatch(ids, torch.ones_like(ids), resp, torch.zeros(ids.shape), versions=versions)
    cur = current_logprobs(tiny_llama, batch)
    shift = torch.zeros(ids.shape)
    shift[0, 2:4] = 3.0  # behavior far more likely than now: rho = e^-3 on 2 tokens
    shift[1, 2] = -3.0  # behavior far less likely: rho = e^3 on 1 token
    batch.behavior_logprobs = (cur + shift) * resp
    w_none, m_none = stale_token_weights(tiny_llama, batch, "none", version=3)
    assert w_none is None and m_none["audit/is_max"] == pytest.approx(float(torch.exp(torch.tensor(3.0))), rel=1e-4)
    assert m_none["audit/is_stale_token_frac"] == pytest.approx(4 / 8)
    w_ice, m_ice = stale_token_weights(tiny_llama, batch, "icepop", 0.5, 2.0)
    assert m_ice["audit/is_masked_frac"] == pytest.approx(3 / 8)
    assert w_ice is not None and int((w_ice[resp.bool()] == 0).sum()) == 3
    w_cap, m_cap = stale_token_weights(tiny_llama, batch, "cap", 0.5, 2.0)
    assert m_cap["audit/is_masked_frac"] == pytest.approx(1 / 8)
    w_clip, m_clip = stale_token_weights(tiny_llama, batch, "clip", 0.5, 2.0)
    assert m_clip["audit/is_clipped_frac"] == pytest.approx(3 / 8)
    assert w_clip is not None and float(w_clip[resp.bool()].min()) == pytest.approx(0.5)
    assert float(w_clip[resp.bool()].max()) == pytest.approx(2.0)
    assert torch.all(w_clip[~resp.bool()] == 0)


@pytest.mark.parametrize("level", ["token", "prefix"])
@pytest.mark.parametrize("junk", [float("-inf"), float("nan"), float("inf")])
def test_junk_behavior_logprobs_outside_the_response_do_not_reach_the_weights(
    tiny_llama: torch.nn.Module, level: str, junk: float
) -> None:
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(3))
    resp = torch.zeros_like(ids)
    resp[:, 3:] = 1
    resp[1, 6] = 0  # a right-padded row: junk after the response as well as before it
    batch = ProbeBatch(ids, torch.ones_like(ids), resp, torch.zeros(ids.shape))
    clean = current_logprobs(tiny_llama, batch) * resp
    batch.behavior_logprobs = torch.where(resp.bool(), clean, torch.full(ids.shape, junk))
    w, m = stale_token_weights(tiny_llama, batch, "clip", 0.5, 2.0, level=level)
    assert w is not None and bool(torch.isfinite(w).all())
    torch.testing.assert_close(w, resp.float())
    assert all(v == v for v in m.values())  # no NaN diagnostics
    res = audit(tiny_llama, batch, [2, 3], method="fast", macro=False, token_weights=w)
    assert all(v == v for v in res.cosines.values())
