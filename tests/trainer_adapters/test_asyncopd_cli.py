"""``adwin train --scheduler asyncopd`` end to end through the CLI on tiny checkpoints (CPU, 3 updates)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from tiny_models import make_tiny_llama

from adwin.cli import main
from adwin.runtime.checkpoint import latest_checkpoint, load_weights
from adwin.tasks.tokenizer import build_tokenizer
from adwin.teacher.checkpoints import load_model
from adwin.teacher.local import Teachers

pytestmark = pytest.mark.timeout(180)


def _save(path: Path, seed: int) -> str:
    model = make_tiny_llama(seed=seed)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path)
    build_tokenizer().save_pretrained(str(path))
    return str(path)


def _config(tmp: Path, **extra: object) -> Path:
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{i % 7}+{i % 5}=", "answer": str(i % 7 + i % 5)}) + "\n"
                               for i in range(24)))
    cfg = {
        "model": {"student": _save(tmp / "student", 0), "teachers": {"default": _save(tmp / "teacher", 10)}},
        "data": {"task": "jsonl", "path": str(prompts), "n_eval": 2, "max_prompt_len": 8},
        "out_dir": str(tmp / "runs"),
        "rollout": {"prompts_per_step": 2, "samples_per_prompt": 2, "max_response_len": 12},
        "window": {"candidates": [4, 8]},
        "probes": {"batch_size": 2, "offers_per_step": 2, "staleness_limit": 3},
        "loss": {"name": "reverse_kl_mc", "mc_samples": 2},
        "eval": {"n_problems": 2, "every": 2},
        "asyncopd": {"queue_depth": 1, "worker_batch": 8, "teacher_batch": 8, "throughput_warmup": 1,
                     "wait_timeout_s": 60},
        "controller": {"serve": False},
        "logging": {"progress": False},
        "optim": {"lr": 1e-3},
    }
    cfg.update(extra)
    path = tmp / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_train_scheduler_asyncopd_runs_to_a_summary_with_pipeline_metrics(tmp_path: Path, capsys) -> None:
    cfg = _config(tmp_path)
    rc = main(["train", "--config", str(cfg), "--scheduler", "asyncopd", "--steps", "3", "--seed", "1",
               "--name", "aopd"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "accuracy" in out
    run_dir = tmp_path / "runs" / "aopd"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and len(summary["windows"]) == 3
    assert summary["sync_tokens"] > 0 and summary["full_equiv_tokens"] >= summary["sync_tokens"]
    a = summary["asyncopd"]
    B = 4
    assert a["batch_size"] == B and a["permits"]["capacity"] == 2 * B
    assert a["checks"]["max_unconsumed"] <= 2 * B and a["checks"]["gate_violations"] == 0
    assert summary["throughput_tokens_per_s"] > 0 and 0 < summary["pipeline_overlap"] <= 3
    assert a["loss"] == "reverse_kl_mc" and a["mc_samples"] == 2
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for key in ("async/staleness_mean", "pipeline/overlap", "rollout/sync_tokens", "window/current",
                "loss/total", "optim/lr", "time/wall", "rollout/logprob_gap_p99"):
        assert all(key in r for r in rows), key
    assert "async/throughput_tokens_per_s" not in rows[0]  # warm-up update
    assert all("async/throughput_tokens_per_s" in r for r in rows[1:])
    assert "eval/accuracy" in rows[0] and "eval/accuracy" in rows[-1]
    assert summary["time"]["train"] > 0 and summary["time"]["rollout"] > 0
    resolved = json.loads((run_dir / "config.json").read_text())
    assert resolved["scheduler"] == "asyncopd"
    assert (run_dir / "checkpoint-3").is_dir()


def test_asyncopd_with_a_loss_it_cannot_correct_fails_before_compute(tmp_path: Path, capsys) -> None:
    cfg = _config(tmp_path)
    assert main(["train", "--config", str(cfg), "--scheduler", "asyncopd", "--set", "loss.name=jsd"]) == 2
    err = capsys.readouterr().err
    assert "loss.name" in err and "asyncopd" in err
    assert not (tmp_path / "runs").exists()


def test_oapl_trains_whole_groups_of_one_inference_policy_through_the_cli(tmp_path: Path) -> None:
    cfg = _config(tmp_path, window={"policy": "fixed", "window": 8, "candidates": [4, 8]})
    rc = main(["train", "--config", str(cfg), "--scheduler", "asyncopd", "--steps", "4", "--seed", "1",
               "--name", "oapl", "--set", "loss.name=oapl", "--set", "loss.mc_samples=1", "--set", "loss.oapl.lag=2",
               "--set", "loss.oapl.beta=0.5"])
    assert rc == 0
    run_dir = tmp_path / "runs" / "oapl"
    summary = json.loads((run_dir / "summary.json").read_text())
    a = summary["asyncopd"]
    assert a["loss"] == "oapl" and a["sync_every"] == 2 and a["oapl"]["beta"] == 0.5
    assert a["discarded"] is not None and a["checks"]["gate_violations"] == 0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["async/inference_version"] for r in rows] == [0.0, 2.0, 2.0, 4.0]
    assert all(r["async/staleness_max"] <= 1 for r in rows), "data is at most lag - 1 updates old"
    for key in ("oapl/residual_rms", "oapl/value_mean", "loss/is_ratio_p99", "loss/teacher_kl",
                "rollout/logprob_gap_p99", "async/discarded_items"):
        assert all(key in r and r[key] == r[key] for r in rows), key  # present and not NaN
    assert all(r["oapl/groups"] == 2 and r["oapl/group_size_mean"] == 2 for r in rows)


def test_repeated_non_finite_updates_stop_the_run_at_max_bad_steps_with_a_checkpoint(tmp_path: Path, monkeypatch,
                                                                                      capsys) -> None:
    """As in the synchronous trainer: every update is skipped, and the run stops with exit code 3 after
    ``optim.max_bad_steps`` of them, leaving a checkpoint of the last good state (the initial student)."""
    real_logits, real_score, real_actions = Teachers.logits, Teachers.score, Teachers.actions
    monkeypatch.setattr(Teachers, "logits", lambda self, *a: real_logits(self, *a) * float("inf"))
    monkeypatch.setattr(Teachers, "score", lambda self, *a: real_score(self, *a) * float("inf"))
    # the OAPL learner reads realized and action logprobs in one pass: poison both
    monkeypatch.setattr(Teachers, "actions",
                        lambda self, *a: tuple(x * float("inf") for x in real_actions(self, *a)))
    cfg = _config(tmp_path)
    capsys.readouterr()
    rc = main(["train", "--config", str(cfg), "--scheduler", "asyncopd", "--steps", "6", "--name", "doomed",
               "--set", "optim.max_bad_steps=2"])
    assert rc == 3
    err = [x for x in capsys.readouterr().err.splitlines() if x.startswith("adwin")]
    assert len(err) == 1 and "optim.max_bad_steps=2" in err[0] and "checkpoint-2" in err[0], err
    run_dir = tmp_path / "runs" / "doomed"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["optim/skipped"] for r in rows] == [1.0, 1.0] and rows[-1]["optim/consecutive_skipped"] == 2.0
    assert latest_checkpoint(run_dir) == run_dir / "checkpoint-2"
    initial = load_model(str(tmp_path / "student"), "float32", "cpu")
    saved = load_model(str(tmp_path / "student"), "float32", "cpu")
    load_weights(run_dir / "checkpoint-2", saved, lora=False)
    assert all(torch.equal(a, b) for a, b in zip(initial.parameters(), saved.parameters(), strict=True)), \
        "both updates were skipped: the checkpoint is the start"
