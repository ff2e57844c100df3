"""adwin.bench.audit_replay: the window rules replayed on pools whose truth is set (tests/adwin/audit/synthetic_pool.py),
the noise-reading rule beside them, and the held-out fold that scores them against the pool's other half."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).resolve().parents[1] / "audit"))  # tests/adwin/audit/synthetic_pool.py
from synthetic_pool import synthetic_vectors  # noqa: E402

from adwin.audit import truth as tr  # noqa: E402
from adwin.audit.estimators import cross_gram  # noqa: E402
from adwin.bench import audit_scores as sc  # noqa: E402
from adwin.bench.audit_replay import (  # noqa: E402
    NOISE_RULE,
    RULES,
    SHIPPED,
    TRUTHS_SCHEDULE,
    Rule,
    decisions,
    held_out,
)

CANDS, HORIZON = [64, 128, 256, 512, 1024], 2048
TOKENS = [64, 64, 128, 256, 512, 1024]  # every synthetic response runs to the horizon
FULL = np.full(128, HORIZON)  # (N,) their lengths
NOISE_HOLD = [r for r in RULES if r.noise_hold]
(PRESETS,) = [r for r in RULES if r.name == SHIPPED]
POOLED_POINT = dataclasses.replace(PRESETS, name="pooled point, no fallback", unresolved="decide")
PAPER = RULES[0]
SIGNAL = np.sqrt(sum(TOKENS) / 6)  # noise scale 6, as chain-long's prepared student


def _vectors(cosines: list[float], signal: float, seed: int = 1, n: int = 128) -> np.ndarray:
    return synthetic_vectors(n, cosines, signal=signal, tokens=TOKENS, seed=seed)


def _h(cosines: list[float], signal: float, seed: int = 1) -> np.ndarray:
    return cross_gram(_vectors(cosines, signal, seed))


def _replay(h: np.ndarray, rule: Rule, truth_window: int, cosines: list[float], **kw) -> dict:
    """One rule's shares against a set truth (the synthetic pool's own cosines)."""
    w = decisions(h, CANDS, HORIZON, 0.7, [rule], **kw)[rule.name]
    return sc.score(w, sc.Truth(truth_window, dict(zip(CANDS, cosines, strict=True)), HORIZON, 0.7, CANDS), HORIZON)


NOISY = [0.2, 0.3, 0.35, 0.5, 0.85]
ALIGNED = [0.9, 0.95, 0.97, 0.98, 0.99]


@pytest.mark.parametrize("p", [2, 8])
@pytest.mark.parametrize("rule", NOISE_HOLD, ids=[r.name for r in NOISE_HOLD])
def test_pure_noise_never_moves_a_noise_hold_window(rule: Rule, p: int) -> None:
    out = _replay(_h(NOISY, 0.0), rule, 1024, NOISY, p=p, audits=12, runs=6, rng=np.random.default_rng(0))
    assert out["windows"] == {"1024": 1.0}  # the initial window, the largest candidate


def test_the_replay_starts_where_the_run_starts() -> None:
    (rule,) = [r for r in NOISE_HOLD if r.pool == 1 and r.estimator == "debiased" and r.grow_to == "sure"]
    out = _replay(_h(NOISY, 0.0), rule, 1024, NOISY, p=8, audits=6, runs=3, rng=np.random.default_rng(0), initial=256)
    assert out["windows"] == {"256": 1.0}  # held on noise: the run's window.initial, not the largest candidate


def test_a_pooled_rule_reads_no_audit_older_than_the_staleness_limit() -> None:
    h = _h(ALIGNED, SIGNAL)

    def run(rule: Rule, **kw: int) -> np.ndarray:
        return decisions(h, CANDS, HORIZON, 0.7, [rule], p=8, audits=8, runs=4, rng=np.random.default_rng(3),
                         **kw)[rule.name]

    # audits 3 steps apart under a limit of 2: every pool holds its own audit alone, as the paper's rule reads it
    assert np.array_equal(run(PRESETS, cadence=3, max_age=2), run(PAPER, cadence=3, max_age=2))
    assert not np.array_equal(run(PRESETS, cadence=1, max_age=5), run(PAPER, cadence=1, max_age=5))


def test_on_pure_noise_the_papers_rule_moves_the_window() -> None:
    """Why noise_hold exists: the batch cosine of a long prefix reads sqrt(w / H) in noise, near the threshold."""
    out = _replay(_h(NOISY, 0.0), PAPER, 1024, NOISY, p=8, audits=12, runs=6, rng=np.random.default_rng(0))
    assert out["windows"].get("2048", 0.0) > 0.1


@pytest.mark.parametrize("p, rule", [(8, "debiased, confidence, noise hold"),
                                     (2, "debiased, confidence, noise hold, 4 audits pooled")])
def test_at_small_p_the_debiased_noise_hold_rule_lands_on_the_true_window(p: int, rule: str) -> None:
    (r,) = [x for x in RULES if x.name == rule]
    out = _replay(_h(ALIGNED, SIGNAL), r, 64, ALIGNED, p=p, audits=12, runs=6, rng=np.random.default_rng(0))
    # the first audit starts at the largest candidate; from the second on the rule sits at the truth
    assert out["within_one_rung"]["share"] >= 0.8 and out["admissible"]["share"] == 1.0


@pytest.mark.parametrize("p, cosines, truth_window, initial", [
    (8, ALIGNED, 64, 512),  # shrinks from the run's start to the truth
    (2, [0.2, 0.3, 0.5, 0.8, 0.9], 512, 128),  # grows to it, at the suite's P
])
def test_the_pooled_point_rule_at_small_p_lands_on_the_true_window(p: int, cosines: list[float],
                                                                 truth_window: int, initial: int) -> None:
    out = _replay(_h(cosines, SIGNAL), POOLED_POINT, truth_window, cosines, p=p, audits=12, runs=6,
                  rng=np.random.default_rng(0), initial=initial)
    assert out["within_one_rung"]["share"] >= 0.8


@pytest.mark.parametrize("p, cosines, truth_window, initial", [
    (8, ALIGNED, 64, 512),
    (2, [0.2, 0.3, 0.5, 0.8, 0.9], 512, 128),
])
def test_the_presets_rule_holds_while_the_pool_is_unresolved_and_then_lands_on_the_true_window(
        p: int, cosines: list[float], truth_window: int, initial: int) -> None:
    marks: dict[str, np.ndarray] = {}
    w = decisions(_h(cosines, SIGNAL), CANDS, HORIZON, 0.7, [PRESETS, POOLED_POINT], p=p, audits=12, runs=6,
                  rng=np.random.default_rng(0), initial=initial, marks=marks)
    held, unresolved = w[PRESETS.name], marks[PRESETS.name]  # (runs, audits)
    assert unresolved[:, 0].all() == (p == 2)  # at P = 2 one audit's z is +-1 whatever the gradients
    first = unresolved.argmin(axis=1)  # each run's first resolved audit
    for run, a in enumerate(first):
        assert (held[run, :a] == initial).all()  # unresolved: the window holds where the run starts
        assert not unresolved[run, a:].any()  # the pool, once it resolves, stays resolved on a fixed truth
    resolved = held[~unresolved]
    assert (np.abs(np.log2(resolved / truth_window)) <= 1).mean() >= 0.8  # within one rung once resolved
    # the rule without the fallback decides the same audits alike once the pool resolves
    assert (w[POOLED_POINT.name][:, -4:] == held[:, -4:]).all()


@pytest.mark.parametrize("preset, task", [("default", "chain"), ("long", "chain-long"), ("suite", "chain")])
def test_the_rule_the_replay_calls_the_presets_is_the_one_the_adwin_presets_ship(preset: str, task: str) -> None:
    from adwin.bench.audit_replay import shipped_rule
    from adwin.config import load_config
    from adwin.config.loading import preset_path

    cfg = load_config(preset_path(preset))
    shipped = Rule("shipped", cfg.audit.estimator, cfg.window.confidence, noise_hold=cfg.window.noise_hold,
                   grow_to=cfg.window.grow_to, signal_z=cfg.window.signal_z, pool=cfg.audit.evidence_audits,
                   decay=cfg.audit.evidence_decay, unresolved=cfg.window.unresolved,
                   resolve_samples=cfg.window.resolve_samples)
    (replayed,) = [r for r in RULES if r.name == shipped_rule(task)]
    assert cfg.window.policy == "adwin" and shipped == dataclasses.replace(replayed, name="shipped")


def test_the_batch_estimator_at_small_p_is_held_above_the_true_window_by_its_bias() -> None:
    (rule,) = [r for r in RULES if r.name == "batch, confidence"]
    out = _replay(_h(ALIGNED, SIGNAL), rule, 64, ALIGNED, p=8, audits=12, runs=6, rng=np.random.default_rng(0))
    assert out["within_one_rung"]["share"] < 0.2


@pytest.mark.parametrize("fallback, window", [("hold", 256), ("horizon", HORIZON)])
def test_on_a_pure_noise_pool_every_pooled_audit_is_unresolved_and_the_window_follows_the_fallback(
        fallback: str, window: int) -> None:
    rule = dataclasses.replace(PRESETS, unresolved=fallback)
    marks: dict[str, np.ndarray] = {}
    w = decisions(_h(NOISY, 0.0), CANDS, HORIZON, 0.7, [rule, POOLED_POINT], p=8, audits=12, runs=6,
                  rng=np.random.default_rng(0), initial=256, marks=marks)
    assert marks[rule.name].all() and (w[rule.name] == window).all()
    assert (w[POOLED_POINT.name] != 256).any()  # the rule without it moves on the noise


def test_the_held_out_fold_reports_each_rules_unresolved_share() -> None:
    fold = _fold(_h(NOISY, 0.0), tr.split_pool(128, seed=0), rules=(PAPER, PRESETS), runs=2)
    assert fold["unresolved"]["8"] == {PAPER.name: 1.0, PRESETS.name: 1.0}
    from adwin.bench.audit_report import fold_markdown

    rows = [line for line in fold_markdown(fold, CANDS, 0, 1) if line.startswith(f"| {PRESETS.name} |")]
    assert rows and "| 100 % |" in rows[0]  # the report's unresolved column
    strong = _fold(_h(ALIGNED, SIGNAL), tr.split_pool(128, seed=0), rules=(PRESETS,), runs=2)
    assert strong["unresolved"]["8"][PRESETS.name] < 0.5


# --- the noise-reading rule ----------------------------------------------------------------------------------------


def test_the_noise_reading_rule_reads_the_token_counts_only() -> None:
    lengths = np.random.default_rng(5).integers(40, HORIZON + 1, size=128)  # (N,) varied response lengths

    def run(h: np.ndarray, lens: np.ndarray) -> dict[str, np.ndarray]:
        return decisions(h, CANDS, HORIZON, 0.7, [PAPER], p=8, audits=12, runs=4, rng=np.random.default_rng(0),
                         lengths=lens)

    noise, aligned = run(_h(NOISY, 0.0), lengths), run(_h(ALIGNED, SIGNAL), lengths)
    assert np.array_equal(noise[NOISE_RULE], aligned[NOISE_RULE])  # another pool's gradients: the same decisions
    assert not np.array_equal(noise[PAPER.name], aligned[PAPER.name])  # the batch rule reads them
    shorter = run(_h(NOISY, 0.0), lengths // 4)[NOISE_RULE]
    assert shorter.mean() < noise[NOISE_RULE].mean()  # shorter responses: a shorter prefix covers their tokens


def test_without_lengths_the_noise_reading_rule_reads_the_same_sample_energies() -> None:
    h = _h(NOISY, 0.0)
    idx = np.arange(8)
    np.testing.assert_allclose(
        tr.token_floor(FULL[idx], CANDS), np.sqrt(np.cumsum(TOKENS)[:-1] / HORIZON))  # the synthetic noise energies
    from adwin.bench.audit_replay import noise_reading

    np.testing.assert_allclose(noise_reading(h, CANDS, idx, None), noise_reading(h, CANDS, idx, FULL), atol=0.08)


@pytest.mark.parametrize("rule", [PAPER, PRESETS], ids=lambda r: r.name)
def test_on_a_pure_noise_pool_the_noise_rule_and_the_batch_rule_agree(rule: Rule) -> None:
    # threshold 0.6: the token readings sqrt(w / H) put 1,024 (0.71) and 512 (0.50) clear of it on either side
    out = decisions(_h(NOISY, 0.0), CANDS, HORIZON, 0.6, [rule], p=8, audits=12, runs=6,
                    rng=np.random.default_rng(0), lengths=FULL)
    assert (out[NOISE_RULE] == 1024).all()
    assert (out[rule.name] == out[NOISE_RULE]).mean() >= 0.85


# --- the held-out fold -------------------------------------------------------------------------------------------------


def _fold(h: np.ndarray, halves: tuple[np.ndarray, np.ndarray], rules=(PAPER,), runs: int = 4) -> dict:
    return held_out(h, CANDS, HORIZON, 0.7, truth_idx=halves[0], replay_idx=halves[1], p_run=[8], audits=4,
                    runs=runs, rng=np.random.default_rng(0), lengths=FULL, rules=list(rules))


def test_the_truth_reads_only_its_half_and_the_replay_only_the_other() -> None:
    t, r = tr.split_pool(128, seed=0)
    base = _vectors(NOISY, SIGNAL)
    other = _vectors(ALIGNED, SIGNAL, seed=9)
    swap_truth, swap_replay = base.copy(), base.copy()
    swap_truth[t], swap_replay[r] = other[t], other[r]  # another pool's samples in one half only
    a, b, c = (_fold(cross_gram(v), (t, r)) for v in (base, swap_truth, swap_replay))
    assert a["population"] != b["population"] and a["truth_window"] == 1024 and b["truth_window"] == 64
    assert a["replay"]["8"][PAPER.name]["windows"] == b["replay"]["8"][PAPER.name]["windows"]
    assert a["population"] == c["population"]
    assert a["replay"]["8"][PAPER.name]["windows"] != c["replay"]["8"][PAPER.name]["windows"]
    with pytest.raises(ValueError):  # the halves overlap
        _fold(cross_gram(base), (t, np.concatenate([r, t[:1]])))


def test_a_constant_windows_shares_are_the_hand_computed_ones() -> None:
    # truth 1,024: its population cosine 0.85 clears 0.7, 512's 0.5 does not (both far from it at 64 samples)
    fold = _fold(_h(NOISY, SIGNAL), tr.split_pool(128, seed=0))
    assert fold["truth_window"] == 1024
    scores = fold["replay"]["8"]
    want = {  # (exact, admissible, unsafe, cost)
        64: (0, 0, 1, 64 / 2048), 512: (0, 0, 1, 0.25), 1024: (1, 1, 0, 0.5), 2048: (0, 1, 0, 1.0)}
    for w, shares in want.items():
        got = scores[f"constant {w}"]
        assert tuple(got[m]["share"] for m in sc.METRICS) == pytest.approx(shares), w
        assert all(got[m]["ci"] == pytest.approx([got[m]["share"]] * 2) for m in sc.METRICS)  # no spread over runs
    assert scores["constant 512"]["within_one_rung"]["share"] == 1.0  # why it is only a secondary column
    assert scores[TRUTHS_SCHEDULE] == scores["constant 1024"]


@pytest.mark.parametrize("cosines, lengths, direction", [
    (ALIGNED, HORIZON, sc.SHORTER),  # truth 64, noise reading 1,024 (sqrt(1024 / 2048) = 0.71)
    ([0.2, 0.3, 0.35, 0.4, 0.45], HORIZON, sc.LONGER),  # truth the horizon
    ([0.2, 0.3, 0.35, 0.5, 0.9], HORIZON, sc.SAME),  # both 1,024
    ([0.2, 0.3, 0.35, 0.5, 0.9], 300, sc.LONGER),  # 300-token responses: 256 reads 0.92 on counts alone
])
def test_the_verdict_says_which_way_the_truth_lies_from_the_noise_reading(cosines: list[float], lengths: int,
                                                                           direction: str) -> None:
    halves = tr.split_pool(128, seed=0)
    fold = held_out(_h(cosines, SIGNAL), CANDS, HORIZON, 0.7, truth_idx=halves[0], replay_idx=halves[1], p_run=[8],
                    audits=2, runs=2, rng=np.random.default_rng(0), lengths=np.full(128, lengths), rules=[PAPER])
    assert fold["direction"] == direction
    assert set(fold["versus_noise"]["8"]) == {PAPER.name}


def test_a_pure_noise_half_has_no_truth_and_scores_no_share() -> None:
    fold = _fold(_h(NOISY, 0.0, seed=4), tr.split_pool(128, seed=0))
    assert fold["direction"] == sc.NO_TRUTH and fold["versus_noise"] == {}
    for s in fold["replay"]["8"].values():
        assert s["exact"] is None and s["admissible"] is None and s["cost"] is not None
    assert TRUTHS_SCHEDULE not in fold["replay"]["8"]


def test_the_goals_judge_the_rule_each_regimes_presets_ship() -> None:
    from adwin.bench.audit_replay import SHIPPED_LONG, shipped_rule
    from adwin.bench.compare.plan import UNRESOLVED_BY_REGIME

    by_name = {r.name: r for r in RULES}
    assert shipped_rule("chain") == SHIPPED and shipped_rule("chain-late") == SHIPPED
    assert shipped_rule("chain-long") == SHIPPED_LONG and shipped_rule("chain-late-long") == SHIPPED_LONG
    # the replayed rule falls back as the regime's runs do
    assert by_name[SHIPPED].unresolved == UNRESOLVED_BY_REGIME["short"]
    assert by_name[SHIPPED_LONG].unresolved == UNRESOLVED_BY_REGIME["long"]
