"""audit.estimator (batch | debiased) and the bootstrap confidence interval per candidate cosine.

The debiased Gram keeps only cross-sample pairs, so its expectation is P(P-1) times the Gram of the expected
segment gradients; checked by exact enumeration of every response of a tiny Llama with a 3-token vocabulary."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from adwin.audit.alignment import ProbeBatch, audit, cosines_from_gram
from adwin.audit.estimators import (
    cosine_interval,
    cross_gram,
    debiased_cosines,
    debiased_gram,
    estimator_cosines,
)

V, T, CANDS = 3, 3, [1, 2]


def _models() -> tuple[torch.nn.Module, torch.nn.Module]:
    from tiny_models import make_tiny_llama

    shape = {"vocab_size": V, "hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}
    student, teacher = make_tiny_llama(**shape, seed=0), make_tiny_llama(**shape, seed=1)
    with torch.no_grad():  # far from uniform, so the population gradients are not degenerate
        student.lm_head.weight.mul_(4.0)
        teacher.lm_head.weight.mul_(4.0)
    return student, teacher


@torch.no_grad()
def _all_responses(student: torch.nn.Module, teacher: torch.nn.Module) -> tuple[ProbeBatch, torch.Tensor]:
    """Every response of T tokens after the prompt [1], as one batch, and its probability under the student."""
    ids = torch.tensor([[1, *y] for y in itertools.product(range(V), repeat=T)])  # (V^T, 1 + T)
    resp = torch.zeros_like(ids)
    resp[:, 1:] = 1

    def seq_logp(model: torch.nn.Module) -> torch.Tensor:
        logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[:, :-1]  # (N, T, V)
        out = torch.zeros(ids.shape)
        out[:, 1:] = logp.gather(2, ids[:, 1:, None])[..., 0]
        return out  # (N, 1 + T)

    s, t = seq_logp(student), seq_logp(teacher)
    return ProbeBatch(ids, torch.ones_like(ids), resp, t * resp), s.sum(1).exp()


def _rows(b: ProbeBatch, idx: list[int]) -> ProbeBatch:
    return ProbeBatch(b.input_ids[idx], b.attention_mask[idx], b.response_mask[idx], b.teacher_logprobs[idx])


def test_debiased_gram_expectation_is_the_population_gram_and_its_cosine_the_population_cosine() -> None:
    student, teacher = _models()
    every, prob = _all_responses(student, teacher)
    n = every.input_ids.shape[0]
    assert float(prob.sum()) == pytest.approx(1.0, abs=1e-5)
    weights = prob[:, None].expand(every.input_ids.shape).contiguous()  # (N, 1 + T)
    # The gradient is linear in the token weights: weighting each response by its probability gives the
    # expected segment gradients mu_s themselves, hence the population Gram <mu_s, mu_t>.
    population = audit(student, every, CANDS, method="reference", macro=False, token_weights=weights).gram
    single = [audit(student, _rows(every, [a]), CANDS, method="reference", macro=False).gram for a in range(n)]
    expected_debiased = np.zeros_like(population)
    expected_batch = np.zeros_like(population)
    for a, b in itertools.product(range(n), repeat=2):  # P = 2 i.i.d. draws, every ordered outcome
        pair = audit(student, _rows(every, [a, b]), CANDS, method="reference", macro=False).gram
        w = float(prob[a] * prob[b])
        expected_debiased += w * debiased_gram(pair, [single[a], single[b]])
        expected_batch += w * pair
    np.testing.assert_allclose(expected_debiased, 2.0 * population, rtol=1e-6, atol=1e-9)  # P(P-1) = 2
    pop_cos = cosines_from_gram(population, CANDS)
    deb_cos = cosines_from_gram(expected_debiased, CANDS)
    bat_cos = cosines_from_gram(expected_batch, CANDS)
    for c in CANDS:
        assert deb_cos[c] == pytest.approx(pop_cos[c], abs=1e-6)
    assert max(abs(bat_cos[c] - pop_cos[c]) for c in CANDS) > 0.05  # the batch estimator really is biased here


def test_the_audit_debiased_cosines_are_those_of_the_cross_sample_gram() -> None:
    student, teacher = _models()
    every, _ = _all_responses(student, teacher)
    idx = [0, 5, 11, 17, 26, 13]
    res = audit(student, _rows(every, idx), CANDS, method="fast", estimator="debiased", macro=False)
    singles = [audit(student, _rows(every, [a]), CANDS, method="fast", macro=False).gram for a in idx]
    expected, fallbacks = debiased_cosines(res.gram, singles, CANDS)
    assert res.estimator == "debiased" and res.extra["debiased_fallbacks"] == fallbacks
    assert res.cosines == pytest.approx(expected, abs=1e-6)
    assert res.batch_cosines == pytest.approx(cosines_from_gram(res.gram, CANDS), abs=1e-12)


def test_a_non_positive_cross_sample_norm_falls_back_to_the_batch_cosine_and_is_counted() -> None:
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(2, 3, 5))  # (P, K+1, D): two samples, opposite enough to make D non-PSD
    vecs[1] = -vecs[0] + 0.01 * vecs[1]
    sample = [v @ v.T for v in vecs]
    total = vecs.sum(0)
    gram = total @ total.T
    cos, fallbacks = debiased_cosines(gram, sample, CANDS)
    assert fallbacks == 2
    assert cos == pytest.approx(cosines_from_gram(gram, CANDS))
    with pytest.raises(ValueError, match="audit.estimator=debiased needs >= 2"):
        debiased_gram(gram, sample[:1])


def test_debiased_intervals_cover_the_population_cosine() -> None:
    """90 % intervals from batches of 24 fresh responses cover the population cosine in most batches (the
    batch estimator's do not have to: its target is biased), and always contain the reported cosine."""
    student, teacher = _models()
    every, prob = _all_responses(student, teacher)
    weights = prob[:, None].expand(every.input_ids.shape).contiguous()
    pop = cosines_from_gram(
        audit(student, every, CANDS, method="reference", macro=False, token_weights=weights).gram, CANDS
    )
    g = torch.Generator().manual_seed(0)
    hits, total, widths = 0, 0, []
    for rep in range(12):
        idx = torch.multinomial(prob, 24, replacement=True, generator=g).tolist()
        res = audit(student, _rows(every, idx), CANDS, method="reference", macro=False, estimator="debiased",
                    ci_level=0.9, ci_samples=300, seed=rep)
        for c in CANDS:
            lo, hi = res.cosine_ci[c]
            assert lo <= res.cosines[c] <= hi
            hits += lo <= pop[c] <= hi
            total += 1
            widths.append(hi - lo)
    assert hits / total >= 0.7
    assert 0.0 < float(np.median(widths)) < 1.0  # informative, not the trivial [-1, 1]


def test_sketched_intervals_match_exact_ones() -> None:
    student, teacher = _models()
    every, _ = _all_responses(student, teacher)
    idx = list(range(0, 27, 2))
    exact = audit(student, _rows(every, idx), CANDS, method="reference", macro=False, ci_level=0.8)
    sketched = audit(student, _rows(every, idx), CANDS, method="fast", macro=False, ci_level=0.8)
    for c in CANDS:
        assert sketched.cosine_ci[c] == pytest.approx(exact.cosine_ci[c], abs=0.02)


def test_bootstrap_rejects_bad_settings_naming_the_field() -> None:
    vecs = np.ones((4, 3, 2))
    with pytest.raises(ValueError, match="audit.ci_level"):
        cosine_interval(cross_gram(vecs), CANDS, {1: 0.5, 2: 0.5}, level=1.0)
    with pytest.raises(ValueError, match="audit.ci_samples"):
        cosine_interval(cross_gram(vecs), CANDS, {1: 0.5, 2: 0.5}, n_boot=3)
    with pytest.raises(ValueError, match="audit.estimator"):
        audit(_models()[0], _all_responses(*_models())[0], CANDS, estimator="split")


def test_the_interval_travels_in_the_result_dict() -> None:
    student, teacher = _models()
    every, _ = _all_responses(student, teacher)
    res = audit(student, _rows(every, list(range(8))), CANDS, method="fast", estimator="debiased", ci_level=0.9)
    from adwin.audit.alignment import AuditResult

    back = AuditResult.from_dict(res.to_dict())
    assert back.cosine_ci == res.cosine_ci and back.estimator == "debiased" and back.batch_cosines == res.batch_cosines
    m = res.metrics()
    assert m["audit/cos_ci_low_1"] == res.cosine_ci[1][0] and m["audit/cos_ci_high_2"] == res.cosine_ci[2][1]
    assert m["audit/batch_cos_1"] == res.batch_cosines[1] and "audit/debiased_fallbacks" in m


def _coverage(n: int, dim: int, noise_over_samples: float, pools: int) -> tuple[float, float]:
    """(share of intervals that bound nothing, coverage of the others) of the debiased 90 % interval over ``pools``
    simulated pools of ``n`` samples with known population cosines, noise of effective dimension ``dim`` and
    noise scale ``noise_over_samples * n``."""
    from synthetic_pool import synthetic_vectors

    truth = np.array([0.4, 0.6, 0.75, 0.9, 0.97])
    tokens = [64, 64, 128, 256, 512, 1024]
    cands = [1, 2, 3, 4, 5]
    signal = np.sqrt(sum(tokens) / (noise_over_samples * n))
    wide, hits, shown = 0, 0, 0
    for pool in range(pools):
        h = cross_gram(synthetic_vectors(n, truth, signal=signal, tokens=tokens, dim=dim, seed=pool))
        gram = h.sum(axis=(0, 2))
        cos, _, _ = estimator_cosines(gram, gram - np.einsum("isit->st", h), len(cands), "debiased")
        ci = cosine_interval(h, cands, dict(zip(cands, cos.tolist(), strict=True)), estimator="debiased", level=0.9)
        lo, hi = np.array([ci[c] for c in cands]).T  # each (K,)
        trivial = (lo <= -1.0) & (hi >= 1.0)
        wide += int(trivial.sum())
        hits += int(((lo <= truth) & (truth <= hi))[~trivial].sum())
        shown += int((~trivial).sum())
    return wide / (pools * len(cands)), hits / shown


def test_the_debiased_90_percent_interval_covers_85_to_95_percent_of_pools_with_a_known_cosine() -> None:
    """Over pools of 8 and 24 samples, noise of effective dimension 15 and 40, and noise scale over samples (B/N)
    from 0.05 to 2, the interval covers the population cosine on 85-95 % of the pools where it bounds anything.
    Where the pool cannot bound a cosine (no defined debiased cosine or variance, mostly at B/N >= 1) it says so
    with [-1, 1]; where the signal is clear it (nearly) never does. A bootstrap over samples that keeps each sample's
    pairs with its own copies covers 70-80 % at B/N >= 1 here; one that drops them, ~99 %."""
    for n, dim, b_over_n in itertools.product((8, 24), (15, 40), (0.05, 0.5, 1.0, 2.0)):
        wide, cover = _coverage(n, dim, b_over_n, pools=200)
        # At B/N = 2 the intervals of cosines near 1 are clipped at 1, which leaves them one tail: conservative.
        assert 0.85 <= cover <= (0.95 if b_over_n < 2 else 0.97), (n, dim, b_over_n, cover)
        if b_over_n <= 0.05:
            assert wide <= 0.05, (n, dim, b_over_n, wide)
