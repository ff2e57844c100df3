"""The probe client's evidence pool (probes/evidence.py): staleness counted against the learner's version, and a
pool whose audit settings change is read the new way or emptied, never mixed and never a crash."""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import pytest

from adwin.audit.alignment import AuditResult
from adwin.audit.estimators import cosine_array
from adwin.audit.evidence import pool_evidence
from adwin.audit.job import AuditJob, AuditOutcome, AuditSettings
from adwin.controller import Controller
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.probes.client import ProbeClient
from adwin.probes.pool import Probe, ProbePool

CANDS = [4, 8]
MAX_LEN = 12
S = 3


@dataclass
class Sketches:
    """An ``AuditRunner`` whose audits return per-sample vectors (width: the job's ``sketch_dim``); ``hold`` keeps
    the next outcome back until ``release``."""

    hold: bool = False
    vectors: list[np.ndarray] = field(default_factory=list)
    held: list[tuple[Future[AuditOutcome], AuditOutcome]] = field(default_factory=list)

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]:
        rng = np.random.default_rng(len(self.vectors))
        v = rng.normal(size=(2, len(CANDS) + 1, job.settings.sketch_dim or 16)) + 1.0  # (P, K+1, D)
        self.vectors.append(v)
        gram = np.einsum("isd,jtd->st", v, v)
        cos, _ = cosine_array(gram, len(CANDS))
        res = AuditResult(list(CANDS), dict(zip(CANDS, cos.tolist(), strict=True)), gram=gram, vectors=v)
        outcome = AuditOutcome(job.audit_id, job.version, res, {}, job.settings)
        fut: Future[AuditOutcome] = Future()
        if self.hold:
            self.held.append((fut, outcome))
        else:
            fut.set_result(outcome)
        return fut

    def release(self) -> None:
        for fut, outcome in self.held:
            fut.set_result(outcome)
        self.held.clear()


def _client(settings: AuditSettings) -> tuple[ProbeClient, Sketches]:
    ctrl = Controller()
    run = ctrl.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=CANDS, max_len=MAX_LEN, threshold=0.5),
                                  probe_batch_size=2, offers_per_step=4, staleness_limit=S)).run_id
    client = ProbeClient(ctrl, run, ProbePool(MAX_LEN), S)
    runner = Sketches()
    client.auditor, client.settings = runner, settings
    return client, runner


def _audit(client: ProbeClient, version: int, *, wait: bool = True) -> None:
    """Two fresh probes completed at ``version``, then their batch audited at ``version``."""
    for pid in (f"a{version}", f"b{version}"):
        assert client.offer_fresh(pid, f"prompt-{pid}", version)
        assert client.complete(Probe(pid, [1, 7], [5, 6, 7], [version] * 3, [-1.0] * 3, submitted_step=version,
                                     prompt_id=f"prompt-{pid}", teacher_logprobs=[-1.0] * 3), version)
    client.audit(version, wait=wait)


def _settings(**kw: object) -> AuditSettings:
    base = {"candidates": CANDS, "sketch_dim": 16, "ci_level": 0.9, "ci_samples": 20, "evidence_audits": 8,
            "evidence_decay": 0.7}
    return AuditSettings(**(base | kw))  # type: ignore[arg-type]


def test_a_pooled_audit_more_than_S_versions_behind_the_learner_leaves_the_pool() -> None:
    """The audit at version 0 is S versions behind the newest audit (version 3) but S + 1 behind the learner (4),
    which submits it: none of the pooled samples may rest on weights older than S."""
    client, runner = _client(_settings())
    _audit(client, 0)
    runner.hold = True
    _audit(client, S, wait=False)  # in flight while the learner moves on
    runner.release()
    client.audit(S + 1, wait=True)
    assert client.counts["audits"] == 2
    assert [w for _, w in client._evidence.history] == [S]


def test_a_pooled_audit_within_S_versions_of_the_learner_stays() -> None:
    client, runner = _client(_settings())
    _audit(client, 1)
    runner.hold = True
    _audit(client, S, wait=False)
    runner.release()
    client.audit(S + 1, wait=True)
    assert [w for _, w in client._evidence.history] == [1, S]


@pytest.mark.parametrize(("name", "value"), [("evidence_decay", 0.3), ("estimator", "debiased"), ("ci_level", 0.5),
                                             ("ci_samples", 50), ("evidence_audits", 4)])
def test_a_changed_reading_setting_reads_the_kept_vectors_the_new_way(name: str, value: object) -> None:
    client, runner = _client(_settings())
    _audit(client, 0)
    client.settings = dataclasses.replace(client.settings, **{name: value})
    _audit(client, 1)
    pool = client._evidence
    assert getattr(pool, {"evidence_decay": "decay", "ci_level": "level", "ci_samples": "n_boot",
                          "evidence_audits": "audits"}.get(name, name)) == value
    assert len(pool.history) == 2
    s = client.settings
    want = pool_evidence(runner.vectors, [1, 0], s.evidence_decay, CANDS, estimator=s.estimator, level=None)
    assert client.record.last_cosines == pytest.approx(want.cosines)


@pytest.mark.parametrize(("name", "value"), [("seed", 1), ("sketch_dim", 32), ("method", "sketch"),
                                             ("params", "top:1"), ("metric", "adam"), ("is_method", "clip")])
def test_a_setting_that_makes_other_vectors_empties_the_pool_with_a_warning(
        name: str, value: object, caplog: pytest.LogCaptureFixture) -> None:
    client, runner = _client(_settings())
    _audit(client, 0)
    _audit(client, 1)
    client.settings = dataclasses.replace(client.settings, **{name: value})
    with caplog.at_level(logging.WARNING, logger="adwin.probes.evidence"):
        _audit(client, 2)
    assert len(client._evidence.history) == 1, "vectors of two kinds are never pooled"
    assert name in caplog.text and "2 earlier audits are dropped" in caplog.text
    v = runner.vectors[-1]
    want, _ = cosine_array(np.einsum("isd,jtd->st", v, v), len(CANDS))  # this audit alone
    assert client.record.last_cosines == pytest.approx(dict(zip(CANDS, want.tolist(), strict=True)))
    _audit(client, 3)
    assert len(client._evidence.history) == 2  # and the new kind pools again
