"""Drift diagnostics (paper section 3.1): parity with a per-rollout loop written from the definitions,
and the properties that make them readable (survival never rises, rejections never fall)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from adwin.audit.drift import (
    branching_factor,
    cumulative_rejection,
    drift_curves,
    drift_metrics,
    position_stats,
    to_response_positions,
    topk_survival,
)


def _batch(seed: int, b: int = 5, length: int = 12, vocab: int = 7) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, length, vocab, generator=g) * 2  # (B, L, V)
    ids = torch.randint(0, vocab, (b, length), generator=g)  # (B, L)
    resp = torch.zeros(b, length, dtype=torch.long)  # (B, L)
    for i in range(b):  # prompt of 2..3 tokens, response of 1.. tokens, right padding
        p = 2 + i % 2
        n = 1 + int(torch.randint(0, length - p, (1,), generator=g))
        resp[i, p : p + n] = 1
    return logits, ids, resp


def _reference(logits: torch.Tensor, ids: torch.Tensor, resp: torch.Tensor, k: int) -> dict[str, list[float]]:
    """Loops over rollouts and positions, straight from the definitions."""
    rows = []
    for i in range(ids.shape[0]):
        cols = [j for j in range(ids.shape[1]) if resp[i, j]]
        per = []
        for j in cols:
            probs = torch.softmax(logits[i, j - 1].double(), -1).tolist()
            entropy = -sum(p * math.log(p) for p in probs if p > 0)
            order = sorted(range(len(probs)), key=lambda v: -probs[v])
            higher = sum(1 for v in order if probs[v] > probs[int(ids[i, j])])
            per.append((math.exp(entropy), higher + 1))
        rows.append(per)
    width = max(len(r) for r in rows)
    ppl, surv, rej = [], [], []
    for t in range(width):
        alive = [r[t][0] for r in rows if len(r) > t]
        ppl.append(sum(alive) / len(alive))
        counts = [sum(1 for (_, rank) in r[: t + 1] if rank > k) for r in rows]
        surv.append(sum(1 for c in counts if c == 0) / len(rows))
        rej.append(sum(counts) / len(rows))
    return {"ppl": ppl, "survival": surv, "rejections": rej}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 4))
def test_curves_match_a_per_rollout_loop_from_the_definitions(seed: int, k: int) -> None:
    logits, ids, resp = _batch(seed)
    got = drift_curves(logits, ids, resp, ks=(k,))
    want = _reference(logits, ids, resp, k)
    assert torch.allclose(torch.tensor(got["ppl"]), torch.tensor(want["ppl"], dtype=torch.float32), atol=1e-4)
    for name in ("survival", "rejections"):
        assert torch.allclose(torch.tensor(got[f"{name}_{k}"]), torch.tensor(want[name], dtype=torch.float32))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 6))
def test_survival_never_rises_rejections_never_fall_and_larger_k_survives_more(seed: int, k: int) -> None:
    logits, ids, resp = _batch(seed)
    entropy, rank = position_stats(logits, ids)
    rank_r, mask_r = to_response_positions(rank, resp)
    surv, rej = topk_survival(rank_r, mask_r, k), cumulative_rejection(rank_r, mask_r, k)
    assert (surv[1:] <= surv[:-1]).all() and (rej[1:] >= rej[:-1]).all()
    assert ((surv >= 0) & (surv <= 1)).all()
    assert (topk_survival(rank_r, mask_r, k + 1) >= surv).all()
    # the branching factor lies between 1 (one certain token) and V (uniform)
    bf = branching_factor(*to_response_positions(entropy, resp))
    assert ((bf >= 1 - 1e-5) & (bf <= logits.shape[-1] + 1e-4)).all()


def test_uniform_teacher_has_branching_factor_v_and_a_certain_one_has_1() -> None:
    ids = torch.tensor([[0, 1, 2, 3]])  # (1, L)
    resp = torch.tensor([[0, 1, 1, 1]])
    bf = branching_factor(*to_response_positions(position_stats(torch.zeros(1, 4, 9), ids)[0], resp))
    assert torch.allclose(bf, torch.full((3,), 9.0))
    sharp = torch.full((1, 4, 9), -1e4)
    sharp[0, torch.arange(3), ids[0, 1:]] = 0.0  # the teacher is certain of every realized token
    entropy, rank = position_stats(sharp, ids)
    rank_r, mask_r = to_response_positions(rank, resp)
    assert torch.allclose(branching_factor(*to_response_positions(entropy, resp)), torch.ones(3))
    assert topk_survival(rank_r, mask_r, 1).tolist() == [1.0, 1.0, 1.0]


def test_response_positions_start_at_each_rows_first_response_token() -> None:
    x = torch.tensor([[9, 9, 1, 2, 3, 0], [9, 1, 2, 0, 0, 0]])
    resp = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]])
    x_r, mask_r = to_response_positions(x, resp)
    assert x_r[mask_r].tolist() == [1, 2, 3, 1, 2]
    assert mask_r.tolist() == [[True, True, True], [True, True, False]]


def test_metrics_read_the_curves_at_window_boundaries() -> None:
    curves = {"ppl": [1.0, 3.0, 5.0, float("nan")], "survival_1": [1.0, 0.5, 0.5, 0.25]}
    m = drift_metrics(curves, positions=(2, 4, 64))
    assert m == {"drift/ppl_2": 2.0, "drift/survival_1_at_2": 0.5, "drift/ppl_4": 5.0, "drift/survival_1_at_4": 0.25}
