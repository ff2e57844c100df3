"""Probe workers with their own student replica (thread and Ray): weights shipped at step boundaries
and a killed Ray actor on a local cluster (num_cpus=2). One ``ray.init`` for the session (conftest)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from client_rounds import advance
from tiny_models import make_tiny_llama

from adwin.cli import main
from adwin.config import LoraSection
from adwin.controller import Controller
from adwin.controller.schemas import OfferIn, PolicyIn, ProbeOfferItem, RunIn
from adwin.objectives.losses import token_logprobs
from adwin.probes.async_executor import AsyncProbeExecutor
from adwin.probes.executors import build_executor
from adwin.probes.pool import Probe, ProbePool
from adwin.student.lora import apply_lora, trainable_named_parameters
from adwin.student.structure import is_lora

ray = pytest.importorskip("ray")

MAX_LEN = 48
NO_EOS = {1000}  # outside the 64-token vocabulary: rounds always use their whole budget


def _run(max_len: int = MAX_LEN, s: int = 5) -> tuple[Controller, str]:
    ctl = Controller()
    run = ctl.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=[4, 8], max_len=max_len),
                                 probe_batch_size=2, staleness_limit=s, offers_per_step=4))
    return ctl, run.run_id


def _offer(ctl: Controller, run_id: str, pool: ProbePool, ids: list[str], prefix: list[int] | None = None) -> None:
    prefix = prefix or [9, 9]
    offers = [ProbeOfferItem(sample_id=i, prompt_id=f"p-{i}", response_len=len(prefix), version=0) for i in ids]
    assert ctl.offer_probes(run_id, OfferIn(step=0, offers=offers)).accepted == ids
    for i in ids:
        pool.add(Probe(i, [1, 5, 6], list(prefix), [0] * len(prefix), [-1.0] * len(prefix), "default", 0))


def _drain(ex: AsyncProbeExecutor) -> None:
    for slot in ex.slots:
        if slot.future is not None:
            slot.future.exception(timeout=120)


def _perturb(model: torch.nn.Module) -> None:
    """Stand-in for an optimizer step: a visible change of the output distribution (of what trains: a LoRA
    student's adapters, whose base is frozen)."""
    with torch.no_grad():
        if is_lora(model):
            for _, p in trainable_named_parameters(model):
                p.add_(0.5)
        else:
            model.lm_head.weight.mul_(3.0)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("backend", ["thread", "ray"])
def test_worker_replica_samples_with_the_weights_published_at_the_step_boundary(
        backend: str, lora: bool, request: pytest.FixtureRequest) -> None:
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    torch.manual_seed(0)
    student = make_tiny_llama(seed=0)
    if lora:  # the replica is a copy of the peft model; each publish ships the adapters only
        pytest.importorskip("peft")
        student = apply_lora(student, LoraSection(r=4))
    ctl, run_id = _run()
    pool = ProbePool(MAX_LEN)
    ex = build_executor(backend, pool, student, eos=NO_EOS, pad_id=0)
    try:
        _offer(ctl, run_id, pool, ["a"])
        _perturb(student)  # optimizer step 0 -> the workers must move to version 1
        ex.publish(1)
        advance(ex, ctl, run_id, 1)
        _drain(ex)
        advance(ex, ctl, run_id, 1)
        probe = pool.get("a")
        assert probe.versions[:10] == [0, 0] + [1] * 8  # window 8 (ADWIN starts at the largest candidate)
        ids = torch.tensor([probe.prompt_ids + probe.response_ids[:10]])
        with torch.no_grad():
            now = token_logprobs(student(input_ids=ids).logits, ids)[0, -8:]  # (8,) under version 1
        behavior = torch.tensor(probe.behavior_logprobs[2:10])
        torch.testing.assert_close(behavior, now, atol=1e-4, rtol=1e-4)
        with torch.no_grad():
            before = token_logprobs(make_tiny_llama(seed=0)(input_ids=ids).logits, ids)[0, -8:]  # version 0
        assert (behavior - before).abs().max() > 1e-2  # the check can tell the versions apart
    finally:
        ex.close()


def test_killed_ray_actor_loses_no_probe_and_training_continues(ray_cluster: None,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    student = make_tiny_llama(seed=1)
    ctl, run_id = _run(max_len=400, s=50)
    pool = ProbePool(400)
    ex = build_executor("ray", pool, student, eos=NO_EOS, pad_id=0)
    try:
        _offer(ctl, run_id, pool, ["a", "b"])
        ex.publish(1)
        stats = advance(ex, ctl, run_id, 1)
        assert stats.in_flight == 2  # the round was handed to the (still starting) actor
        victim = ex.slots[0].worker
        ray.kill(victim.actor)  # mid-run: the actor dies before or while it extends
        _drain(ex)
        ex.publish(2)
        after = advance(ex, ctl, run_id, 2)
        assert (after.restarts, after.reissued, after.lost) == (1, 2, 0)
        assert after.submitted == 2 and ex.slots[0].worker is not victim
        assert 1 not in pool.get("a").versions  # re-issued from the recorded prefix, nothing of the lost round
        _drain(ex)
        advance(ex, ctl, run_id, 2)
        for pid in ("a", "b"):
            assert pool.get(pid).versions[:10] == [0, 0] + [2] * 8  # the new actor extended them with version 2
        assert ctl.telemetry(run_id).probes["dropped"] == 0
        assert any("died" in r.message for r in caplog.records)
    finally:
        ex.close()


@pytest.mark.parametrize("backend", ["thread", "ray"])
def test_train_runs_the_builtin_task_with_each_probe_backend(backend: str, tiny_home: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             request: pytest.FixtureRequest) -> None:
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    monkeypatch.setenv("ADWIN_HOME", str(tiny_home))
    out = tmp_path / "out"
    rc = main(["train", "--profile", "tiny", "--steps", "3", "--probe-backend", backend, "--no-serve", "--no-progress",
               "--out", str(out), "--name", backend, "--set", "eval.n_problems=2", "--set", "rollout.prompts_per_step=2",
               "--set", "probes.batch_size=2", "--set", "probes.staleness_limit=2", "--set", "window.candidates=[8,16]"])
    assert rc == 0
    rows = [json.loads(line) for line in (out / backend / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    metrics = [r.get("metrics", r) for r in rows]
    assert all("probe/blocked_s" in m for m in metrics)
    assert sum(m["probe/submitted"] for m in metrics) > 0  # rounds went to the workers
    assert max(m["probe/staleness_max"] for m in metrics) <= 2
    assert json.loads((out / backend / "config.json").read_text())["probes"]["backend"] == backend


def test_a_later_run_asking_for_another_ray_cluster_is_told_it_is_not_applied(ray_cluster: None,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    from adwin.probes.ray_actor import ensure_ray

    with caplog.at_level("WARNING", logger="adwin.probes.ray_actor"):
        ensure_ray(None, num_cpus=2)  # what the running cluster was started with: nothing to say
        assert not caplog.records
        ensure_ray(None, num_cpus=1)
    assert "probes.ray_num_cpus=1 not applied" in caplog.text
