"""Every audit, window and probe setting acts in every loop, or the config refuses it at load.

For each scheduler x probe backend and each field of ``window``, ``probes`` and ``audit``, a short run with the
field at another value (in the context where it should matter, e.g. ``probes.is_low`` under an IS method) must
either be refused by ``load_config`` naming the field, or differ from the same run at the default in what the
run did: the run spec the controller registered, the audit jobs the probe client ran (their settings), the probe
client's and its executor's configuration, and, where the run is a pure function of its seed (inline and rollout
probes), every logged metric but the timings. A setting a loop silently ignores fails here: this is the test that would
have caught AsyncOPD audits that never saw ``audit.ci_level``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from trainer_fixtures import TIMING_KEYS, tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.probes import audit_steps
from adwin.probes import client as client_module

# field -> (another value, the context in which the field should act)
CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "window.policy": ("fixed", {"window.window": 4, "window.confidence": False}),
    "window.candidates": ([4, 12], {}),
    "window.threshold": (0.3, {}),
    "window.initial": (4, {}),
    "window.window": (8, {"window.policy": "fixed", "window.window": 4}),
    "window.start": (8, {"window.policy": "linear", "window.start": 4, "window.step": 1}),
    "window.step": (2, {"window.policy": "linear", "window.start": 4, "window.step": 1}),
    "window.confidence": (True, {"audit.ci_level": 0.9}),
    "window.surprise.threshold": (-2.0, {"window.policy": "surprise"}),
    "window.surprise.rank": (2, {"window.policy": "surprise"}),
    "window.surprise.quantile": (0.5, {"window.policy": "surprise"}),
    "window.surprise.scale": (2.0, {"window.policy": "surprise"}),
    "window.surprise.ema": (0.9, {"window.policy": "surprise"}),
    "window.surprise.min": (5, {"window.policy": "surprise"}),
    "window.surprise.max": (12, {"window.policy": "surprise"}),
    "probes.batch_size": (3, {}),
    "probes.staleness_limit": (3, {}),
    "probes.offers_per_step": (1, {}),
    "probes.max_active": (3, {}),
    "probes.selection": ("stratified", {}),
    "probes.offer_finished": ("always", {}),
    "probes.lookahead": (0, {}),
    "probes.is_method": ("clip", {}),
    "probes.is_low": (0.8, {"probes.is_method": "clip"}),
    "probes.is_high": (1.2, {"probes.is_method": "clip"}),
    "probes.is_level": ("prefix", {"probes.is_method": "clip"}),
    "probes.workers": (2, {}),
    "probes.fault_policy": ("drop", {}),
    "probes.max_reissues": (0, {}),
    "probes.ray_address": ("127.0.0.1:1", {}),
    "probes.ray_num_cpus": (1, {}),
    "audit.method": ("reference", {}),
    "audit.metric": ("adam", {}),
    "audit.sketch_dim": (64, {"audit.method": "sketch"}),
    "audit.params": ("top:1", {}),
    "audit.estimator": ("debiased", {}),
    "audit.macro": (True, {}),
    "audit.ci_level": (0.8, {}),
    "audit.ci_samples": (20, {"audit.ci_level": 0.9}),
    "audit.every": (2, {}),
    "audit.skip_margin": (0.1, {}),
    "audit.skip_history": (1, {"audit.skip_margin": 0.1}),
    "audit.max_skips": (1, {"audit.skip_margin": 0.1}),
    "audit.budget": (0.01, {}),
    "audit.pool_max": (1, {"audit.budget": 0.01}),
}
LOOPS = {
    "sync-inline": {"probes.backend": "inline"},
    "sync-thread": {"probes.backend": "thread"},
    "sync-ray": {"probes.backend": "ray"},
    "sync-rollout": {"probes.backend": "rollout"},
    # fresh full-length probes finish late in a pipeline: enough updates and staleness for an audit to happen
    # (the default decision budget lets a tiny run of fresh probes audit too rarely to compare)
    "asyncopd": {"scheduler": "asyncopd", "loss.name": "reverse_kl_mc", "steps": 8, "probes.staleness_limit": 6,
                 "audit.budget": None},
}
# Ray starts once per process (the tests share one cluster): a run asking for another probes.ray_address or
# ray_num_cpus is warned instead (tests/probes/test_ray_workers.py), so those act at start-up only
RAY_EXECUTOR = {"probes.workers", "probes.fault_policy", "probes.max_reissues", "audit.method"}
TIMING = TIMING_KEYS


def _plain(value: Any) -> Any:
    """JSON-able, NaN-free form of a settings object or metrics row (NaN != NaN would differ from itself)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.name != "extra"}
    text = json.dumps(value, sort_keys=True, default=lambda o: repr(o) if not hasattr(o, "__dict__")
                      else {k: v for k, v in vars(o).items() if not k.startswith("_")})
    return json.loads(text.replace("NaN", "null"))


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every probe client built and every audit job run, however deep in the loop."""
    seen: dict[str, list[Any]] = {"clients": [], "jobs": []}
    real_init, real_job = client_module.ProbeClient.__post_init__, audit_steps.AuditJob

    def init(self: Any) -> None:
        real_init(self)
        seen["clients"].append(self)

    def job(*args: Any, **kwargs: Any) -> Any:
        made = real_job(*args, **kwargs)
        seen["jobs"].append(_plain(made.settings))
        return made

    monkeypatch.setattr(client_module.ProbeClient, "__post_init__", init)
    monkeypatch.setattr(audit_steps, "AuditJob", job)  # the one builder of the client's jobs
    return seen


def _client_state(client: Any) -> dict[str, Any]:
    ex = client.executor
    return {"offer_finished": client.offer_finished, "staleness": client.staleness_limit,
            "settings": _plain(client.settings) if client.settings is not None else None,
            "schedule": _plain(vars(client.schedule)) if client.schedule is not None else None,
            "budget": None if client.budget is None else {"budget": client.budget.budget,
                                                          "pool_max": client.budget.pool_max},
            "executor": None if ex is None else {"workers": len(ex.slots), "fault_policy": ex.fault_policy,
                                                 "max_reissues": ex.max_reissues}}


def _run(overrides: dict[str, Any], tmp: Path, seen: dict[str, list[Any]]) -> dict[str, Any]:
    """What one short run did; raises ValueError when the config refuses the overrides."""
    from adwin.loop.trainer import train
    from adwin.trainer_adapters.asyncopd.run import run_asyncopd

    cfg = load_config(None, tiny_overrides(tmp, **overrides))
    seen["clients"].clear()
    seen["jobs"].clear()
    ctl = Controller()
    if cfg.scheduler == "asyncopd":
        history, run_id = run_asyncopd(cfg, ctl)["logged"], None
    else:
        result = train(cfg, ctl)
        history, run_id = result.history, result.run_id
    run_id = run_id or ctl.list_runs()[0].run_id
    # the spec minus its fresh run id and the copy of the whole config it carries for the dashboard
    spec = {k: v for k, v in ctl.get_run(run_id).spec.items() if k not in ("config", "run_id")}
    out = {"spec": _plain(spec), "jobs": sorted(map(json.dumps, seen["jobs"]),
           key=str), "clients": [_client_state(c) for c in seen["clients"]]}
    if cfg.scheduler == "sync" and cfg.probes.backend in ("inline", "rollout"):  # a pure function of the seed
        out["history"] = [_plain({k: v for k, v in row.items() if not k.startswith(TIMING)}) for row in history]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_every_setting_changes_the_run_or_is_refused(loop: str, recorder: dict[str, list[Any]], tmp_path: Path,
                                                    request: pytest.FixtureRequest) -> None:
    if loop == "sync-ray":
        request.getfixturevalue("ray_cluster")
    silent: list[str] = []
    base_cache: dict[str, dict[str, Any]] = {}
    for field, (value, context) in CASES.items():
        # A Ray run costs seconds of actor start-up: the Ray loop compares what its executor reads and one audit
        # setting (the jobs its actors run); the rest acts in the controller and the client, the same for every
        # backend, and the other loops cover it
        if loop == "sync-ray" and field not in RAY_EXECUTOR:
            continue
        base_ov = {**LOOPS[loop], "name": "run", **context}
        try:
            load_config(None, tiny_overrides(tmp_path, **{**base_ov, field: value}))
        except ValueError as e:  # refused at load: fine, as long as it names the field
            assert field in str(e) or field.rsplit(".", 1)[-1] in str(e), f"{field}: refused without naming it: {e}"
            continue
        key = json.dumps(context, sort_keys=True)
        if key not in base_cache:
            base_cache[key] = _run(base_ov, tmp_path, recorder)
        changed = _run({**base_ov, field: value}, tmp_path, recorder)
        base = base_cache[key]
        if all(base[k] == changed[k] for k in base):
            silent.append(field)
    assert not silent, f"{loop}: these settings neither changed the run nor were refused at load: {silent}"


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_every_loop_audits_in_the_runs_compared(loop: str, recorder: dict[str, list[Any]], tmp_path: Path,
                                                request: pytest.FixtureRequest) -> None:
    """The runs are long enough for audit jobs to run, so the audit settings are seen acting, not configured."""
    if loop == "sync-ray":
        request.getfixturevalue("ray_cluster")
    assert _run({**LOOPS[loop], "name": "run"}, tmp_path, recorder)["jobs"]


def test_the_fingerprint_sees_a_change_and_not_a_rerun(recorder: dict[str, list[Any]], tmp_path: Path) -> None:
    """The comparison is not vacuous: the same inline run twice is equal, a changed audit setting is not."""
    one = _run({"probes.backend": "inline", "name": "run"}, tmp_path, recorder)
    two = _run({"probes.backend": "inline", "name": "run"}, tmp_path, recorder)
    assert one == two and one["jobs"], "an inline run must be a pure function of its seed, and audit"
    other = _run({"probes.backend": "inline", "name": "run", "audit.macro": True}, tmp_path, recorder)
    assert other["jobs"] != one["jobs"]
