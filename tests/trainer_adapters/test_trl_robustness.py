"""Issue 17 through the real TRL ``DistillationTrainer``: the callback audits in every ordinary setup, refuses the
setups that cannot audit before training, and survives a SIGKILLed ``adwin controller serve``."""

from __future__ import annotations

import logging
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from trl_fixtures import MAX_LEN, make_trainer, rows

from adwin.config import AuditConfig
from adwin.controller import Controller
from adwin.controller.api import InvalidInput, RunConflict
from adwin.controller.remote import RemoteController
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.controller.serve import spawn_server

pytest.importorskip("trl")
pytest.importorskip("datasets")

from adwin.trainer_adapters.trl import AdwinCallback  # noqa: E402


def test_a_largest_candidate_equal_to_the_horizon_still_audits(tmp_path: Path) -> None:
    """Issue case 1: the run starts at max_completion_length; its full-length rollouts are the probes."""
    trainer = make_trainer(tmp_path, steps=2)
    cb = AdwinCallback(Controller(), "top", candidates=[8, MAX_LEN], probe_count=4).attach(trainer)
    trainer.train()
    assert cb.windows[0] == MAX_LEN
    assert rows(trainer)[0]["probe/accepted"] == 4.0
    assert cb.decisions and cb.decisions[0].decision is not None and cb.decisions[0].decision.reason == "audit"


def test_a_window_at_the_full_length_keeps_auditing_every_step(tmp_path: Path) -> None:
    """Issue case 2: threshold 1.0 sends the window to the horizon; audits must go on from there."""
    trainer = make_trainer(tmp_path, steps=4)
    cb = AdwinCallback(Controller(), "full", candidates=[4, 8], threshold=1.0, probe_count=4,
                       audit=AuditConfig(budget=None)).attach(trainer)  # every step's batch audited
    trainer.train()
    assert list(cb.windows.values())[1:] == [MAX_LEN] * 3
    assert len(cb.decisions) == 4 and all(d.state == "decided" for d in cb.decisions)
    assert rows(trainer)[-1]["probe/audits"] == 4.0


def test_a_probe_count_the_trainer_batch_cannot_fill_fails_at_attach(tmp_path: Path) -> None:
    """Issue case 3: probe_count=64 with 8 rollouts a step and S=5 leaves at most 48 probes alive."""
    trainer = make_trainer(tmp_path, steps=1, batch=8)
    with pytest.raises(ValueError, match=r"probe_batch_size=64 can never fill: at most 48 .*set probe_batch_size <= 48"):
        AdwinCallback(Controller(), "big", candidates=[4, 8], probe_count=64).attach(trainer)
    assert not any(isinstance(c, AdwinCallback) for c in trainer.callback_handler.callbacks)


def test_an_unfillable_run_spec_is_refused_by_the_controller_at_attach(tmp_path: Path) -> None:
    """Issue case 4: the old RunIn defaults (P=64, 4 offers a step, S=5) are a 422 now, before any step."""
    trainer = make_trainer(tmp_path, steps=1)
    spec = RunIn(run_id="old-defaults", policy=PolicyIn(candidates=[4, 8], max_len=MAX_LEN), probe_batch_size=64)
    with pytest.raises(InvalidInput, match="probe_batch_size=64"):
        AdwinCallback(Controller(), spec).attach(trainer)


def test_reattaching_a_run_id_with_another_threshold_is_a_conflict_unless_resumed(tmp_path: Path) -> None:
    ctrl = Controller()
    AdwinCallback(ctrl, "again", candidates=[4, 8], probe_count=4).attach(make_trainer(tmp_path, steps=1))
    with pytest.raises(RunConflict):
        AdwinCallback(ctrl, "again", candidates=[4, 8], threshold=0.3, probe_count=4).attach(
            make_trainer(tmp_path, steps=1))
    cb = AdwinCallback(ctrl, "again", candidates=[4, 8], threshold=0.3, probe_count=4, resume=True).attach(
        make_trainer(tmp_path, steps=1))
    assert cb.client is not None and cb.client.run_id == "again"


class _KillThenRestart:
    """Kills the served controller after step ``kill_at`` and starts it again (same db, same port) after ``back_at``."""

    def __init__(self, proc: subprocess.Popen, db: str, port: int, kill_at: int, back_at: int) -> None:
        self.proc, self.db, self.port, self.kill_at, self.back_at = proc, db, port, kill_at, back_at

    def __getattr__(self, name: str) -> Any:  # every other TrainerCallback event is a no-op
        return lambda *a, **k: None

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.kill_at:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        if state.global_step == self.back_at:
            self.proc, _ = spawn_server(self.db, port=self.port, timeout_s=60)


def test_a_sigkilled_controller_leaves_trl_training_on_the_last_window(tmp_path: Path, caplog) -> None:
    db = str(tmp_path / "controller.db")
    proc, url = spawn_server(db, timeout_s=60)
    port = int(url.rsplit(":", 1)[1])
    killer = _KillThenRestart(proc, db, port, kill_at=2, back_at=4)
    api = RemoteController(url, retries=0, timeout=5.0)
    try:
        trainer = make_trainer(tmp_path, steps=6)
        cb = AdwinCallback(api, "killed", candidates=[4, 8], threshold=0.3, probe_count=4).attach(trainer)
        trainer.add_callback(killer)
        with caplog.at_level(logging.WARNING):
            trainer.train()
        assert trainer.state.global_step == 6, "training finished through the outage"
        # steps 2 and 3 ran while the controller was down: on the window it gave last
        assert cb.windows[2] == cb.windows[3] == cb.windows[1]
        outages = [r for r in caplog.records if "controller unavailable" in r.getMessage()]
        assert len(outages) == 1, "one warning per outage, not one per call"
        logged = rows(trainer)
        assert logged[2]["controller/degraded"] > 0 and logged[0]["controller/degraded"] == 0.0
        assert all("controller/pending" in r for r in logged)
        # the writes buffered during the outage reached the restarted controller by the end of training
        assert cb.client is not None and cb.client.controller.metrics()["controller/pending"] == 0.0
        tel = RemoteController(url, retries=0).telemetry("killed")
        assert [s["step"] for s in tel.steps] == list(range(6))
    finally:
        api.close()
        killer.proc.send_signal(signal.SIGKILL)
        killer.proc.wait(timeout=30)


def test_gradient_accumulation_counts_toward_the_rollouts_a_step_can_offer(tmp_path: Path) -> None:
    """One generation batch is per_device_train_batch_size x gradient_accumulation_steps rollouts."""
    with pytest.raises(ValueError, match=r"rollouts_per_step=4"):
        AdwinCallback(Controller(), "acc1", candidates=[4, 8], probe_count=40).attach(make_trainer(tmp_path, steps=1))
    trainer = make_trainer(tmp_path, steps=1, gradient_accumulation_steps=2)  # 8 rollouts x 6 steps >= 40
    cb = AdwinCallback(Controller(), "acc2", candidates=[4, 8], probe_count=40).attach(trainer)
    assert cb.client is not None and cb.client.probe_batch_size == 40


def test_an_unknown_offer_rule_fails_when_the_callback_is_built() -> None:
    with pytest.raises(ValueError, match="offer_finished"):
        AdwinCallback(Controller(), "x", candidates=[4, 8], offer_finished="finished-only")
