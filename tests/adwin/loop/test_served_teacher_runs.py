"""The synchronous trainer with a teacher behind a server: the same run as with the teacher in process (same
seed), and a server killed mid-run stops the step after its retries with a checkpoint that resumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from teacher_servers import in_thread, start, stop
from trainer_fixtures import make_assets, tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.trainer import train
from adwin.runtime.guards import TeacherOutage
from adwin.runtime.resume import open_resumed_controller

# what the teacher's answers decide: losses, windows, audits, evaluation (drift/* needs full logits: a served
# teacher has none, and the decision budget charges FLOPs by the teachers' parameter counts)
COMPARED = ("loss/", "window/", "eval/", "audit/micro_cos", "audit/next_window", "optim/grad_norm", "rollout/")
# process-wide compile telemetry (adwin.decode.static_cache.LEDGER): a test that compiled earlier in the process shows
# up in the next run's first step; seconds are timings, not what the teacher's answers decide
TIMINGS = ("rollout/compile_s", "rollout/compiled_shapes")


def _compared(history: list[dict[str, Any]]) -> list[dict[str, float]]:
    return [{k: v for k, v in row.items() if k.startswith(COMPARED) and k not in TIMINGS} for row in history]


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys() and ra == pytest.approx(rb, abs=1e-6)


def _pure(tmp: Path, **extra: object) -> dict[str, object]:
    """A run that is a pure function of its seed (per-sample seeding, inline probes, no clock in the budget)."""
    return tiny_overrides(tmp, **{"rollout.seeding": "per_sample", "probes.backend": "inline", **extra})


def _served(ov: dict[str, object], url: str, **extra: object) -> dict[str, object]:
    return ov | {"model.teacher_backend": "server", "model.teachers": {"default": url}} | extra


@pytest.mark.parametrize("loss", ["reverse_kl_pg", "forward_kl_topk"])
def test_a_served_teacher_trains_the_same_run_as_the_local_one(tmp_path: Path, loss: str) -> None:
    ov = _pure(tmp_path, **{"loss.name": loss, "loss.topk": 8})
    local = train(load_config(None, ov | {"name": "local"}), Controller())
    with in_thread(ov["model.teachers"]["default"]) as url:  # type: ignore[index]
        served = train(load_config(None, _served(ov, url, name="served")), Controller())
    a, b = _compared(local.history), _compared(served.history)
    assert len(a) == 3 and "eval/teacher_kl" in a[-1]
    _same(a, b)
    assert any("audit/micro_cos_4" in r for r in a)  # the run audited (the probe side scored with the server)


def test_two_routes_on_two_servers_train_the_same_run_as_two_local_teachers(tmp_path: Path) -> None:
    ov = _pure(tmp_path) | make_assets(tmp_path / "routes", routes=("math", "code"))
    local = train(load_config(None, ov | {"name": "local2"}), Controller())
    paths = ov["model.teachers"]
    with in_thread(paths["math"], "math") as u_math, in_thread(paths["code"], "code") as u_code:  # type: ignore[index]
        served = train(load_config(None, ov | {"name": "served2", "model.teacher_backend": "server",
                                               "model.teachers": {"math": u_math, "code": u_code}}), Controller())
    _same(_compared(local.history), _compared(served.history))


# batch seeding: the step's rollouts draw from the process's RNG, so the checkpoint must hold the step's starting streams
@pytest.mark.parametrize("seeding", ["per_sample", "batch"])
def test_a_server_killed_mid_run_stops_with_a_checkpoint_that_resumes(tmp_path: Path, seeding: str) -> None:
    ov = _pure(tmp_path, **{"rollout.seeding": seeding})
    teacher = ov["model.teachers"]["default"]  # type: ignore[index]
    proc, base = start(teacher)
    port = int(base.rsplit(":", 1)[1])
    fast = {"model.teacher_server.retries": 2, "model.teacher_server.backoff_seconds": 0.05,
            "model.teacher_server.timeout_seconds": 5.0}
    cfg = load_config(None, _served(ov, f"{base}/v1", name="killed", **fast))

    def kill_after_first_step(t: int, m: dict[str, Any]) -> None:
        if t == 0:
            proc.kill()
            proc.wait(timeout=20)

    try:
        with pytest.raises(TeacherOutage) as err:
            train(cfg, Controller(), on_step=kill_after_first_step)
    finally:
        stop(proc)
    ck = tmp_path / "runs" / "killed" / "checkpoint-1"
    msg = str(err.value)
    assert f"{base}/v1" in msg and "3 attempts" in msg and str(ck) in msg and ck.is_dir()
    assert len((tmp_path / "runs" / "killed" / "metrics.jsonl").read_text().splitlines()) == 1  # step 1 not logged

    with in_thread(teacher, port=port):  # the server is back, on the same address
        resumed = train(cfg, open_resumed_controller(ck), resume=ck)
        straight = train(load_config(None, _served(ov, f"{base}/v1", name="straight", **fast)), Controller())
    assert [r["step"] for r in resumed.history] == [1, 2]
    # step 1 runs on the prompts and seeds a straight run gives it: the resumed run is the straight run
    _same(_compared(resumed.history), _compared(straight.history[1:]))
