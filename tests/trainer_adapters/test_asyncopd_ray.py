"""AsyncOPD with rollout engines in Ray actors (``asyncopd.workers: ray``): one bounded local-Ray run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from asyncopd_stubs import Recorder
from test_asyncopd_pipeline import tiny_cfg, tiny_parts

from adwin.config import AsyncOPDSection
from adwin.controller import Controller
from adwin.trainer_adapters.asyncopd.run import build_asyncopd, run_asyncopd

ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'adwin[ray]'")
pytestmark = pytest.mark.timeout(240)


def test_ray_actor_engines_take_every_sync_and_keep_the_permit_bound(tmp_path: Path) -> None:
    started = not ray.is_initialized()  # another suite may have left a local Ray running: reuse it
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        cfg = tiny_cfg(tmp_path, steps=3)
        parts = tiny_parts()
        opts = AsyncOPDSection(queue_depth=1, rollout_workers=2, worker_batch=8, teacher_batch=8,
                               wait_timeout_s=90, throughput_warmup=1, workers="ray")
        built = build_asyncopd(cfg, Controller(), parts=parts, options=opts)
        rec = Recorder().attach(built.scheduler)
        seen: list[tuple[int, float, list[tuple[int, float]]]] = []

        def check_actors(step: int, m: dict) -> None:  # after the sync of this update, before the next one
            with torch.no_grad():
                learner = float(sum(p.double().sum() for p in parts.student.parameters()))
            seen.append((step, learner, ray.get([e.actor.fingerprint.remote() for e in built.engines])))

        out = run_asyncopd(cfg, built.hooks.controller, built=built, on_step=check_actors)
        B = 4
        assert out["updates"] == 3 and out["checks"]["max_unconsumed"] <= 2 * B
        assert out["checks"]["gate_violations"] == 0
        assert [s for s, _, _ in seen] == [0, 1, 2]
        for step, learner, prints in seen:
            assert [v for v, _ in prints] == [step + 1] * 2, "every actor acknowledged the sync"
            assert all(total == pytest.approx(learner, rel=1e-9) for _, total in prints), "actors hold the learner's weights"
        assert all(e.version == 3 for e in built.engines)
        assert any(v >= 1 for it in rec.consumed for v in it.token_versions), "tokens sampled after a sync"
        assert all(len(it.mc_actions) == it.response_len for it in rec.consumed)
    finally:
        if started:
            ray.shutdown()


def test_shared_weights_are_put_again_for_a_new_dict_even_at_a_reused_address(monkeypatch) -> None:
    """The object store entry is keyed by the dict itself: a new sync's dict that happens to reuse the freed
    address of the previous one must not be handed the previous weights."""
    from adwin.trainer_adapters.asyncopd import ray_engine

    puts: list[object] = []

    class FakeRay:
        @staticmethod
        def put(obj: object) -> int:
            puts.append(dict(obj))  # a copy: the store must not keep the caller's dict alive
            return len(puts)

    monkeypatch.setattr(ray_engine, "_import_ray", lambda: FakeRay)
    shared = ray_engine._SharedWeights()
    first = {"w": 0}
    assert shared.ref(first) == 1 and shared.ref(first) == 1  # one put per sync, whichever proxy asks
    del first  # with an id() key CPython's dict free list hands the freed address to the next dict
    second = {"w": 1}
    assert shared.ref(second) == 2 and puts[-1] == {"w": 1}
