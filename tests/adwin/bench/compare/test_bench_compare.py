"""``adwin bench compare``: the method list, the FLOPs estimate, aggregation over seeds, and a tiny smoke run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from adwin.bench.compare.methods import all_methods, fast_opd_schedule, quick_keys, select_methods
from adwin.bench.compare.stats import aggregate, estimate_flops, goal_check, mean_std
from adwin.cli import main


def test_fast_opd_is_scaled_to_the_horizon_as_256_is_to_8192() -> None:
    assert fast_opd_schedule(8192) == 256
    assert fast_opd_schedule(320) == 10
    assert fast_opd_schedule(16) == 1  # never below one token


def test_method_list_covers_the_papers_table_and_both_baselines() -> None:
    methods = {m.key: m for m in all_methods(320, [32, 64, 128, 192, 256])}
    assert list(methods)[:2] == ["full", "linear"]
    assert {f"fixed-{c}" for c in (32, 64, 128, 192, 256)} <= set(methods)
    assert {f"adwin-{t}" for t in (0.5, 0.6, 0.7, 0.8, 0.9)} <= set(methods)
    off = {"window.confidence": False}  # policies that do not audit unset the default preset's interval rule
    assert methods["linear"].overrides == {"window.policy": "linear", "window.start": 10, "window.step": 10} | off
    assert methods["iw-opd"].overrides == {"window.policy": "full", "loss.iw_gamma": 0.5} | off
    assert methods["surprise"].overrides == {"window.policy": "surprise"} | off and methods["surprise"].adaptive
    assert methods["adwin-0.7"].overrides == {"window.policy": "adwin", "window.threshold": 0.7}
    chosen = [m.key for m in select_methods("adwin,fixed-64", list(methods.values()), None)]
    assert chosen == ["full", "adwin-0.7", "adwin-0.5", "adwin-0.6", "adwin-0.8", "adwin-0.9", "fixed-64"]
    assert quick_keys([32, 64, 128, 192, 256]) == ["full", "linear", "fixed-128", "adwin-0.7", "surprise", "iw-opd"]
    with pytest.raises(ValueError, match="unknown method"):
        select_methods("bogus", list(methods.values()), None)


def test_flops_follow_the_stated_formula() -> None:
    history = [
        {"rollout/prompt_tokens": 40.0, "rollout/sync_tokens": 100.0, "probe/tokens": 30.0},
        {"rollout/prompt_tokens": 40.0, "rollout/sync_tokens": 60.0, "probe/tokens": 10.0, "audit/probe_tokens": 50.0},
    ]
    ns, nt = 1000, 3000
    f = estimate_flops(history, ns, nt, probe_batch=2, samples_per_step=4)
    mean_prompt = 80.0 / 8  # prompt tokens per rollout sample
    sync = (2 * ns + 2 * nt + 6 * ns) * (80 + 160)
    probe = 2 * ns * 40 + (2 * nt + 6 * ns) * (50 + 2 * mean_prompt)
    assert f["flops_sync"] == pytest.approx(sync)
    assert f["flops_probe"] == pytest.approx(probe)
    assert f["flops"] == pytest.approx(sync + probe)


def _row(method: str, seed: int, acc: float, tokens: float) -> dict:
    row = {m: 1.0 for m in ("teacher_kl_final", "probe_tokens", "flops", "wall_s", "train_wall_s", "audit_overhead_s",
                            "audit_overhead_frac", "probe_flops_frac", "mean_window", "gain_per_mtoken")}
    return row | {"method": method, "seed": seed, "accuracy_final": acc, "sync_tokens": tokens,
                  "rollout_tokens": tokens, "accuracy_per_mtoken": acc / tokens * 1e6}


def test_aggregation_gives_mean_spread_and_ratios_to_full() -> None:
    runs = [_row("full", 0, 0.6, 1000), _row("full", 1, 0.8, 1000),
            _row("adwin-0.7", 0, 0.7, 250), _row("adwin-0.7", 1, 0.7, 250), _row("fixed-32", 0, 0.2, 100)]
    agg = aggregate(runs, ["full", "adwin-0.7", "fixed-32"])
    full = agg["full"]["metrics"]["accuracy_final"]
    assert full["mean"] == pytest.approx(0.7) and full["std"] == pytest.approx(math.sqrt(0.02)) and full["n"] == 2
    assert agg["adwin-0.7"]["ratio_to_full"]["rollout_tokens"] == pytest.approx(0.25)
    assert agg["fixed-32"]["metrics"]["accuracy_final"]["std"] == 0.0  # one seed: no spread
    goal = goal_check(agg)
    assert goal["accuracy_within_full_spread"] and goal["rollout_token_reduction"] == pytest.approx(4.0)
    assert goal["best_accuracy_per_token"] == "adwin-0.7" and goal["met"]
    runs[2]["accuracy_final"] = runs[3]["accuracy_final"] = 0.5  # below full's mean minus its std
    assert not goal_check(aggregate(runs, ["full", "adwin-0.7"]))["met"]
    assert math.isnan(mean_std([float("nan")])["mean"])


def test_tiny_compare_writes_table_json_plots_and_html(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    # its size is asserted, not its time: a shared machine's load would make a wall-clock bound flaky
    rc = main(["bench", "compare", "--quick", "--profile", "tiny", "--out", str(tmp_path / "out")])
    assert rc == 0
    (folder,) = (tmp_path / "out").iterdir()
    assert folder.name.endswith("-tiny")
    res = json.loads((folder / "results.json").read_text())
    assert res["meta"]["smoke"] is True and res["meta"]["steps"] == 2
    keys = ["full", "linear", "fixed-8", "adwin-0.7", "surprise", "iw-opd"]
    assert list(res["methods"]) == keys and [r["method"] for r in res["runs"]] == keys
    runs = {r["method"]: r for r in res["runs"]}
    assert runs["linear"]["windows"] == [1, 2]  # 16-token horizon: Fast OPD 1/+1
    assert runs["full"]["windows"] == [16, 16] and runs["fixed-8"]["windows"] == [8, 8]
    assert all(r["probe_tokens"] == 0 for k, r in runs.items() if k != "adwin-0.7")
    assert runs["full"]["sync_tokens"] >= runs["fixed-8"]["sync_tokens"] >= runs["linear"]["sync_tokens"]
    assert all(r["flops"] > 0 and 0.0 <= r["accuracy_final"] <= 1.0 for r in runs.values())
    assert runs["adwin-0.7"]["probe_flops_frac"] > 0 and runs["full"]["probe_flops_frac"] == 0
    assert res["methods"]["full"]["ratio_to_full"]["flops"] == pytest.approx(1.0)
    assert "6·N_s" in res["meta"]["flops_formula"]
    for name in ("accuracy_vs_tokens.png", "windows.png"):
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (folder / "index.html").read_text()
    assert "SMOKE RUN" in page and "adwin-0.7" in page and "accuracy_vs_tokens.png" in page
    out = capsys.readouterr().out
    assert "SMOKE RUN" in out and "iw-opd" in out
    # teacher-forced line skill per window bin (16-token horizon, ladder up to 8): every run, and a table row each
    assert all(set(r["forced_bins"]) and set(r["forced_bins"]) <= {"4", "8", "12", "16"} for r in runs.values())
    assert all(0.0 <= v <= 1.0 for r in runs.values() for v in r["forced_bins"].values())
    assert "> 12" in out and "Teacher-forced line skill" in (folder / "results.md").read_text()


def test_the_shared_start_of_run_evaluation_equals_each_methods_own(tmp_path: Path, monkeypatch) -> None:
    """bench compare evaluates the starting student once per seed; a method's run that evaluates for
    itself must get exactly the same numbers, whatever the method, and its final scores stay paired."""
    import argparse

    from adwin.bench.compare.command import initial_eval_job, run_one
    from adwin.bench.compare.methods import Method, all_methods
    from adwin.bench.compare.setup import TINY_OVERRIDES, base_overrides
    from adwin.config import load_config

    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    args = argparse.Namespace(set=[])
    base = load_config(None, base_overrides(args, "tiny", 2) | TINY_OVERRIDES | {"probes.backend": "inline"})
    methods = {m.key: m for m in all_methods(base.rollout.max_response_len, list(base.window.candidates))}
    shared = initial_eval_job(base, 1, "tiny", 0)
    for key in ("fixed-8", "adwin-0.7"):
        own = run_one(base, methods[key], 1, "tiny", 0, tmp_path / key)
        given = run_one(base, methods[key], 1, "tiny", 0, tmp_path / f"{key}-shared", shared)
        assert own["accuracy_initial"] == shared["eval/accuracy"] == given["accuracy_initial"]
        assert own["teacher_kl_initial"] == pytest.approx(shared["eval/teacher_kl"], rel=1e-6)
        assert own["eval_scores"] == given["eval_scores"] and own["windows"] == given["windows"]
    with pytest.raises(ValueError, match="eval.k"):
        run_one(base, Method("odd", "odd", {"eval.k": 2}), 1, "tiny", 0, tmp_path / "odd", shared)


def test_a_compare_across_tasks_defaults_to_the_goals_methods() -> None:
    from adwin.bench.compare.methods import all_methods, select_methods, suite_keys

    cands = [32, 64, 128, 192, 256]
    chosen = [m.key for m in select_methods(None, all_methods(320, cands), suite_keys(cands))]
    assert chosen == ["full", "linear", "fixed-32", "fixed-64", "fixed-128", "fixed-192", "fixed-256", "adwin-0.7"]


def test_asyncopd_methods_are_opt_in_families_with_one_pipeline_and_their_lags() -> None:
    methods = all_methods(320, [32, 64, 128, 192, 256], samples_per_step=16)
    default = [m.key for m in select_methods(None, methods, None)]
    assert not any(k.startswith("asyncopd") for k in default), "opt-in methods never join the default set"
    chosen = {m.key: m for m in select_methods("asyncopd-is,asyncopd-oapl", methods, None)}
    assert list(chosen) == ["full"] + [f"asyncopd-{o}-L{lag}" for o in ("is", "oapl") for lag in (1, 4, 16)]
    is4, oapl4 = chosen["asyncopd-is-L4"].overrides, chosen["asyncopd-oapl-L4"].overrides
    assert is4["asyncopd.sync_every"] == 4 and oapl4["loss.oapl.lag"] == 4 and oapl4["loss.name"] == "oapl"
    shared = {k: v for k, v in is4.items() if k not in ("loss.name", "asyncopd.sync_every")}
    assert shared == {k: v for k, v in oapl4.items() if k not in ("loss.name", "loss.oapl.lag")}, \
        "IS and OAPL differ only by the objective and how the lag is named"
    assert shared["rollout.prompts_per_step"] * shared["rollout.samples_per_prompt"] == 16
    assert shared["scheduler"] == "asyncopd" and shared["window.policy"] == "full"  # the base policy audits
    fixed_base = {m.key: m for m in all_methods(320, [32, 64], samples_per_step=16, window_policy="fixed")}
    assert not any(k.startswith("window.") for k in fixed_base["asyncopd-oapl-L16"].overrides), \
        "a base window that does not audit is kept: --set window.policy=fixed runs every method at one window"


def test_tiny_compare_runs_is_and_oapl_under_the_asyncopd_scheduler(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    rc = main(["bench", "compare", "--profile", "tiny", "--methods", "asyncopd-is,asyncopd-oapl", "--steps", "3",
               "--out", str(tmp_path / "out"), "--no-plots"])
    assert rc == 0
    (folder,) = (tmp_path / "out").iterdir()
    res = json.loads((folder / "results.json").read_text())
    runs = {r["method"]: r for r in res["runs"]}
    assert list(runs) == ["full"] + [f"asyncopd-{o}-L{lag}" for o in ("is", "oapl") for lag in (1, 4, 16)]
    for key, r in runs.items():
        assert 0.0 <= r["accuracy_final"] <= 1.0 and r["sync_tokens"] > 0
        assert r["rollout_tokens"] == pytest.approx(r["sync_tokens"] + r["probe_tokens"] + r["discarded_tokens"])
        if key != "full":
            assert math.isfinite(r["staleness_mean"]) and math.isfinite(r["is_ratio_p99"]), key
    assert runs["full"]["staleness_mean"] is None and runs["full"]["discarded_tokens"] == 0  # NaN -> null
    assert runs["asyncopd-oapl-L1"]["staleness_max"] == 0, "lag 1 with a cleared buffer trains on-policy only"
    assert runs["asyncopd-is-L1"]["staleness_max"] <= 1, "queue depth 1: at most one update old"
    assert all(runs[f"asyncopd-is-L{lag}"]["discarded_tokens"] == 0 for lag in (1, 4, 16)), "IS keeps everything"
    out = capsys.readouterr().out
    assert "lag statistics" in out and "asyncopd-oapl-L16" in out
