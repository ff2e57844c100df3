"""The probe client (as the sync trainer's ``ProbeSide`` drives it): audits in flight are collected in order, never block the learner while young, and are
waited for once their weights are S versions old (no decision rests on older weights)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

from adwin.probes.client import Pending, ProbeClient
from adwin.probes.pool import ProbePool


def _side(limit: int) -> tuple[ProbeClient, list[int]]:
    side = ProbeClient(controller=None, run_id="r", pool=ProbePool(16), staleness_limit=limit)  # type: ignore[arg-type]
    submitted: list[int] = []

    def submit(p: Pending, version: int) -> dict[str, float]:
        submitted.append(p.audit_id)
        return {"audit/submitted": 1.0}

    side._submit = submit  # type: ignore[method-assign]  # the controller round trip is tested elsewhere
    return side, submitted


def _pending(audit_id: int, version: int, fut: Future) -> Pending:
    return Pending(audit_id, version, [0], 1.0, fut)


def test_young_audits_in_flight_do_not_block_and_finished_ones_are_collected_in_order() -> None:
    side, submitted = _side(limit=3)
    done, running = Future(), Future()
    done.set_result(None)
    side.pending.extend([_pending(1, 4, done), _pending(2, 4, running), _pending(3, 4, done)])
    m = side._collect({}, version=5, block=False)
    assert submitted == [1] and m["audit/in_flight"] == 2.0  # 3 waits behind 2: batch order is kept


def test_an_audit_whose_weights_are_s_versions_old_is_waited_for() -> None:
    side, submitted = _side(limit=3)
    slow: Future = Future()
    threading.Timer(0.2, slow.set_result, args=(None,)).start()
    side.pending.append(_pending(1, 4, slow))
    side._collect({}, version=6, block=False)
    assert submitted == [] and not slow.done()  # 2 versions old: the learner goes on
    m = side._collect({}, version=7, block=False)  # 3 = S versions old: wait
    assert submitted == [1] and m["audit/submitted"] == 1.0 and m["audit/in_flight"] == 0.0


def test_counts_add_up_when_several_audits_come_back_in_one_step() -> None:
    side, _ = _side(limit=3)
    for i in range(3):
        f: Future = Future()
        f.set_result(None)
        side.pending.append(_pending(i, 4, f))
    assert side._collect({}, version=5, block=True)["audit/submitted"] == 3.0
