"""trainer_adapters/registration.py: a reused run id with another spec is a 409 unless resume=True, embedded and remote."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from adwin.controller import Controller
from adwin.controller.api import RunConflict
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.runtime.resilient_controller import ResilientController
from adwin.trainer_adapters.generic import WindowClient
from adwin.trainer_adapters.hooks import ControllerWindowHooks
from adwin.trainer_adapters.registration import resilient, spec_key


@pytest.fixture(params=["embedded", "remote"])
def api(request: pytest.FixtureRequest) -> Iterator[object]:
    if request.param == "embedded":
        yield Controller()
        return
    from adwin.controller.remote import RemoteController

    client = RemoteController(request.getfixturevalue("remote_url"), retries=1, backoff=0.01, timeout=10.0)
    yield client
    client.close()


def _spec(run_id: str, **policy: object) -> RunIn:
    return RunIn(run_id=run_id, policy=PolicyIn(**{"candidates": [4, 8], "max_len": 16, **policy}))


def test_a_changed_spec_under_a_reused_run_id_is_a_409(api, request) -> None:
    rid = f"reuse-{request.node.callspec.id}"
    first = WindowClient(api, _spec(rid))
    assert WindowClient(api, _spec(rid)).run_id == first.run_id  # the same spec again: the same run
    with pytest.raises(RunConflict, match="resume=True") as err:
        WindowClient(api, _spec(rid, threshold=0.3))
    assert err.value.status == 409
    with pytest.raises(RunConflict):
        WindowClient(api, _spec(rid, candidates=[2, 4, 8]))


def test_resume_continues_the_registered_run_with_its_stored_spec(api, request, caplog) -> None:
    rid = f"resume-{request.node.callspec.id}"
    WindowClient(api, _spec(rid))
    with caplog.at_level(logging.WARNING, logger="adwin.trainer_adapters.registration"):
        client = WindowClient(api, _spec(rid, candidates=[2, 4, 8], threshold=0.3), resume=True)
    assert client.run_id == rid and client.candidates == [4, 8]  # the stored spec wins
    assert "resume=True" in caplog.text and "policy" in caplog.text


def test_the_register_key_follows_the_spec() -> None:
    assert spec_key(_spec("k")) == spec_key(_spec("k"))
    assert spec_key(_spec("k")) != spec_key(_spec("k", threshold=0.3))


def test_clients_and_hooks_wrap_the_controller_in_degraded_mode_by_default() -> None:
    ctrl = Controller()
    client = WindowClient(ctrl, _spec("wrap"))
    assert isinstance(client.controller, ResilientController) and client.controller.inner is ctrl
    assert WindowClient(ctrl, "wrap", resilient_controller=False).controller is ctrl
    assert isinstance(ControllerWindowHooks(ctrl, "wrap", max_len=16).controller, ResilientController)
    wrapped = resilient(ctrl)
    assert resilient(wrapped) is wrapped  # never wrapped twice
    assert {"controller/degraded", "controller/pending"} <= set(client.metrics())


def test_a_client_refuses_a_run_that_cannot_fill_a_batch_with_its_rollouts() -> None:
    ctrl = Controller()
    ctrl.register_run(RunIn(run_id="few", policy=PolicyIn(candidates=[4, 8], max_len=16), probe_batch_size=20,
                            offers_per_step=4, staleness_limit=5))
    assert WindowClient(ctrl, "few").run_id == "few"  # 4 offers x 6 steps = 24 >= 20
    with pytest.raises(ValueError, match=r"probe_batch_size=20 can never fill.*rollouts_per_step=2.*<= 12"):
        WindowClient(ctrl, "few", rollouts_per_step=2)
