"""The sync trainer with ``probes.backend: rollout``: probe rounds ride the next step's rollout call, on the
weights version they were submitted at, a run is a pure function of its seed, checkpoints and the run's end
with a round still parked neither wait nor lose probes, and the loops that cannot carry it refuse it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trainer_fixtures import TIMING_KEYS, tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.sharding import check_data_parallel
from adwin.loop.trainer import train
from adwin.probes import riding
from adwin.runtime.resume import open_resumed_controller


def _run(tmp: Path, name: str, **extra: Any) -> list[dict[str, Any]]:
    cfg = load_config(None, tiny_overrides(tmp, **{"probes.backend": "rollout", "name": name, "steps": 5, **extra}))
    return train(cfg, Controller()).history


def _plain(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if not k.startswith(TIMING_KEYS) and v == v} for row in history]


@pytest.mark.parametrize("seeding", ["per_sample", "batch"])
def test_a_riding_run_is_a_pure_function_of_its_seed(tmp_path: Path, seeding: str) -> None:
    one = _run(tmp_path, "one", **{"rollout.seeding": seeding})
    two = _run(tmp_path, "two", **{"rollout.seeding": seeding})
    assert _plain(one) == _plain(two)
    assert sum(r["probe/rider_rows"] for r in one) > 0 and sum(r.get("audit/submitted", 0) for r in one) >= 1
    # the riders decode within the call's window: the call never decodes more steps than its window
    assert all(0 < r["rollout/decode_steps"] <= r["window/current"] for r in one)


def test_rounds_ride_the_next_rollout_on_the_version_they_were_submitted_at(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    boarded: list[tuple[int, int]] = []
    real = riding.RidingWorker.board

    def board(self: riding.RidingWorker, window: int) -> Any:
        job = self._parked[0] if self._parked is not None else None
        out = real(self, window)
        if job is not None:
            boarded.append((job.version, self.weights_version()))
        return out

    monkeypatch.setattr(riding.RidingWorker, "board", board)
    history = _run(tmp_path, "tags", **{"checkpoint_every": 1})  # a checkpoint after every step: rounds parked
    assert boarded and all(job == held for job, held in boarded)
    # step t's round (version t + 1) rides step t + 1's rollout: never stale, nothing re-issued or lost
    assert [v for v, _ in boarded] == sorted(v for v, _ in boarded)
    assert all(r["probe/reissued"] == 0 and r["probe/lost"] == 0 for r in history if "probe/reissued" in r)
    assert (tmp_path / "runs" / "tags" / "checkpoint-5").exists()  # the last step's round was parked: closed


def test_a_run_resumed_from_a_checkpoint_taken_with_a_round_parked_finishes(tmp_path: Path) -> None:
    """The parked round is not in the checkpoint (the pool holds its probes' recorded prefixes): the resumed run's
    plan extends them again, on the resumed weights."""
    _run(tmp_path, "res", **{"checkpoint_every": 2, "steps": 4})
    ck = tmp_path / "runs" / "res" / "checkpoint-2"
    cfg = load_config(None, tiny_overrides(tmp_path, **{"probes.backend": "rollout", "name": "res", "steps": 4,
                                                        "checkpoint_every": 2}))
    res = train(cfg, open_resumed_controller(ck), resume=ck)
    assert [h["step"] for h in res.history] == [2, 3]
    assert all(r["probe/lost"] == 0 for r in res.history)


def test_the_rollout_backend_is_refused_where_it_cannot_ride(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="probes.backend"):
        load_config(None, tiny_overrides(tmp_path, **{"probes.backend": "rollout", "scheduler": "asyncopd",
                                                      "loss.name": "reverse_kl_mc"}))
    with pytest.raises(ValueError, match="probes.workers"):
        load_config(None, tiny_overrides(tmp_path, **{"probes.backend": "rollout", "probes.workers": 2}))
    cfg = load_config(None, tiny_overrides(tmp_path, **{"probes.backend": "rollout"}))
    with pytest.raises(ValueError, match="probes.backend"):
        check_data_parallel(cfg, 2)
    with pytest.raises(ValueError, match="probes.backend"):  # the thread worker's replica is not the vLLM engine
        load_config(None, tiny_overrides(tmp_path, **{"probes.backend": "thread", "rollout.backend": "vllm"}))
    # riding is what the vLLM engine is for: its probe requests go into the rollout call
    assert load_config(None, tiny_overrides(tmp_path, **{"probes.backend": "rollout",
                                                         "rollout.backend": "vllm"})).probes.backend == "rollout"
