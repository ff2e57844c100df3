"""Durability of the SQLite store: a re-opened controller serves what the old one acknowledged."""

from __future__ import annotations

import sqlite3
import threading

import numpy as np
import pytest
from controller_harness import CANDIDATES, finish, offers, run_spec, sketch_b64

from adwin.audit.alignment import cosines_from_gram
from adwin.controller import Controller
from adwin.controller.schemas import AuditIn, StepMetricsIn
from adwin.controller.store import SCHEMA_VERSION, SchemaVersionError


def test_reopened_controller_serves_the_same_runs_windows_and_telemetry(tmp_path):
    db = str(tmp_path / "c.db")
    a = Controller(db)
    rid = a.register_run(run_spec(world_size=2)).run_id
    a.offer_probes(rid, offers(0, 4))
    for pid in ("s0", "s1"):
        finish(a, rid, pid)
    batch = a.next_probe_batch(rid)
    a.submit_audit(rid, batch.audit_id, AuditIn(rank=0, cosines=None, sketch_b64=sketch_b64(np.ones((4, 3))), sketch_shape=(4, 3)))
    a.report_step(rid, StepMetricsIn(step=2, metrics={"loss/total": 0.3}))
    a.offer_probes(rid, offers(3, 2, prefix="k"), idempotency_key="same")
    before = (a.get_run(rid), a.get_window(rid, 4), a.telemetry(rid), a.probe_plan(rid, 4))
    a.close()

    b = Controller(db)
    assert (b.get_run(rid), b.get_window(rid, 4), b.telemetry(rid), b.probe_plan(rid, 4)) == before
    assert b.offer_probes(rid, offers(3, 2, prefix="k"), idempotency_key="same").accepted == ["k0", "k1"]
    # the pending sketch audit survived: the second rank decides it on the re-opened controller
    sk = np.ones((4, 3))
    sk[3] = -1.0  # makes the summed full gradient differ from every prefix
    out = b.submit_audit(rid, batch.audit_id, AuditIn(rank=1, sketch_b64=sketch_b64(sk), sketch_shape=(4, 3)))
    assert out.state == "decided" and out.ranks_received == 2
    window = out.decision.window
    b.close()
    c = Controller(db)
    w = c.get_window(rid, 9)
    assert (w.window, w.reason, w.audit_id) == (window, "audit", batch.audit_id)
    assert c.get_run(rid).policy_state["decisions"] == 1
    c.close()


def test_a_database_from_a_newer_adwin_is_refused(tmp_path):
    db = tmp_path / "new.db"
    Controller(str(db)).close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(SchemaVersionError, match="newer than this adwin supports"):
        Controller(str(db))


def test_file_databases_use_wal(tmp_path):
    ctrl = Controller(str(tmp_path / "w.db"))
    assert ctrl._store.one("PRAGMA journal_mode")[0] == "wal"
    ctrl.close()


def test_concurrent_callers_are_serialized_safely(tmp_path):
    ctrl = Controller(str(tmp_path / "t.db"))
    rid = ctrl.register_run(run_spec(offers_per_step=1000, max_active_probes=10_000)).run_id
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            for i in range(25):
                ctrl.get_window(rid, i)
                ctrl.report_step(rid, StepMetricsIn(step=w * 100 + i, metrics={"x": float(i)}))
                ctrl.offer_probes(rid, offers(i, 2, prefix=f"w{w}-{i}-"))
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    tel = ctrl.telemetry(rid)
    assert len(tel.steps) == 100 and tel.probes["active"] == 200
    assert ctrl.get_window(rid, 0).window == CANDIDATES[-1]
    ctrl.close()


@pytest.mark.parametrize("run_id", ["-..", "r.1"])  # ".." itself is refused at registration
def test_pending_sketch_ranks_live_in_files_next_to_the_db_until_their_audit_is_purged(tmp_path, run_id):
    db = tmp_path / "c.db"
    a = Controller(str(db))
    assert not (tmp_path / "c.db.sketches").exists()  # created by the first pending rank only
    rid = a.register_run(run_spec(run_id=run_id, world_size=3)).run_id
    a.offer_probes(rid, offers(0, 4))
    for pid in ("s0", "s1", "s2", "s3"):
        finish(a, rid, pid)
    batch = a.next_probe_batch(rid)
    rng = np.random.default_rng(5)
    sk = rng.normal(size=(3, 4, 16)).astype(np.float32)  # (R, K+1, D)
    a.submit_sketch(rid, batch.audit_id, 0, sk[0])
    a.submit_sketch(rid, batch.audit_id, 2, sk[2])
    files = sorted(p.name for p in (tmp_path / "c.db.sketches").iterdir())
    assert files == [f"{run_id.encode().hex()}-{batch.audit_id}-{r}.f32" for r in (0, 2)]  # never a path part
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.db", "c.db-shm", "c.db-wal", "c.db.sketches"]
    a.close()

    b = Controller(str(db))  # a restart in between: the deciding rank reads the others from their files
    out = b.submit_sketch(rid, batch.audit_id, 1, sk[1])
    total = sk.astype(np.float64).sum(0)
    assert out.state == "decided" and out.cosines == pytest.approx(cosines_from_gram(total @ total.T, CANDIDATES))
    assert len(list((tmp_path / "c.db.sketches").iterdir())) == 2  # not yet purged: off the decision path
    b.next_probe_batch(rid)
    assert list((tmp_path / "c.db.sketches").iterdir()) == []
    b.close()
