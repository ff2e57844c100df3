"""The one probe client: fresh probes (AsyncOPD) audited with the sync trainer's settings, refused audits decided by
type on every path (audit math, in-process controller, HTTP), and one mapping from the config to the audit."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.audit.alignment import AuditResult
from adwin.audit.errors import NonFiniteAuditError
from adwin.audit.job import AuditJob, AuditOutcome, AuditSettings
from adwin.config import AuditConfig, load_config
from adwin.controller import Controller
from adwin.controller.api import ControllerAPI, InvalidInput
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.probes.client import InlineAuditor, ProbeClient
from adwin.probes.pool import Probe, ProbePool
from adwin.probes.settings import audit_schedule, audit_settings, run_audit_settings

CANDS = [4, 8]
MAX_LEN = 12


@pytest.fixture(params=["local", "http"])
def api(request: pytest.FixtureRequest) -> Iterator[ControllerAPI]:
    """The in-process controller, and the same behind its HTTP service (``RemoteController``)."""
    ctrl = Controller()
    if request.param == "local":
        yield ctrl
    else:
        from adwin.controller.app import serve_in_thread
        from adwin.controller.remote import RemoteController

        url, stop = serve_in_thread(ctrl, "127.0.0.1", 0)
        remote = RemoteController(url, retries=1, backoff=0.01)
        yield remote
        remote.close()
        stop()
    ctrl.close()


def _client(api: ControllerAPI, *, confidence: bool = False, staleness: int = 3) -> ProbeClient:
    options = {"confidence": 1.0} if confidence else {}
    run = api.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=CANDS, max_len=MAX_LEN, threshold=0.5,
                                                 options=options),
                                 probe_batch_size=2, offers_per_step=4, staleness_limit=staleness)).run_id
    return ProbeClient(api, run, ProbePool(MAX_LEN), staleness)


def _fresh(client: ProbeClient, pid: str, version: int, seed: int, n: int = 10) -> Probe:
    """A fresh probe as a pipeline completes it: full length, its teacher stage's logprobs on it."""
    assert client.offer_fresh(pid, f"prompt-{pid}", version)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, 64, (n,), generator=g).tolist()
    lp = (-torch.rand(n, generator=g) * 3).tolist()
    return Probe(pid, [1, 7, 9], tokens, [version] * n, lp, submitted_step=version, prompt_id=f"prompt-{pid}",
                 teacher_logprobs=(-torch.rand(n, generator=g) * 3).tolist())


@dataclass
class Fixed:
    """An ``AuditRunner`` with given cosines, or an error."""

    cosines: dict[int, float]
    error: Exception | None = None
    jobs: list[AuditJob] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)  # what the audit measured of its evidence

    def submit_audit(self, job: AuditJob) -> Future[AuditOutcome]:
        self.jobs.append(job)
        out: Future[AuditOutcome] = Future()
        if self.error is not None:
            out.set_exception(self.error)
        else:
            out.set_result(AuditOutcome(job.audit_id, job.version,
                                        AuditResult(list(self.cosines), self.cosines, extra=dict(self.extra)), {}))
        return out


def _ready(client: ProbeClient, runner: object, settings: AuditSettings | None = None) -> None:
    client.auditor = runner  # type: ignore[assignment]
    client.settings = settings or AuditSettings(candidates=CANDS)
    for i, pid in enumerate(("a", "b")):
        assert client.complete(_fresh(client, pid, 0, seed=i), 0)


def test_fresh_probes_are_audited_with_the_run_settings_and_an_interval_moves_a_confidence_window(api) -> None:
    client = _client(api, confidence=True)
    settings = audit_settings(AuditConfig(ci_level=0.9, ci_samples=20), CANDS)
    _ready(client, InlineAuditor(make_tiny_llama(seed=0)), settings)
    m = client.audit(1, wait=True)
    assert m["audit/submitted"] == 1.0 and {"audit/cos_ci_low_4", "audit/cos_ci_high_8"} <= m.keys()
    assert client.counts["audits"] == 1 and client.counts["rejected"] == 0
    assert m["audit/next_window"] in (4.0, 8.0, float(MAX_LEN))  # decided (a confidence run needs the interval)
    assert len(client.pool) == 0, "the audited probes are consumed"


@pytest.mark.parametrize("scale, unresolved", [(400.0, 1.0), (1.5, 0.0)])
def test_an_audit_too_small_for_its_noise_scale_is_logged_unresolved_holds_and_sizes_the_next_pool(
        api, scale: float, unresolved: float) -> None:
    from adwin.audit.budget import DecisionBudget, FlopsModel
    from adwin.audit.sizing import EvidenceSizer

    run = api.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=CANDS, max_len=MAX_LEN, threshold=0.5,
                                                 options={"unresolved": 0.0}),  # hold
                                 probe_batch_size=2, offers_per_step=4, staleness_limit=3)).run_id
    client = ProbeClient(api, run, ProbePool(MAX_LEN), 3)
    client.budget = DecisionBudget(None, FlopsModel(10, 10), probe_batch=2, staleness_limit=3, offer_cap=4,
                                   prior_probe_tokens=10.0, prior_extension_tokens=5.0,
                                   sizer=EvidenceSizer(probe_batch=2, min_z=3.0, resolve_samples=1.0))
    measured = {"signal_z": 5.0, "noise_scale": scale, "evidence_samples": 2.0, "effective_dim": 50.0}
    _ready(client, Fixed({4: 0.9, 8: 0.95}, extra=measured))
    m = client.audit(1, wait=True)
    assert m["audit/unresolved"] == unresolved and m["audit/noise_scale"] == scale
    assert m["audit/next_window"] == (CANDS[-1] if unresolved else 4.0)  # held, or the rule's 4
    assert client.budget.sizer.batches == math.ceil(max(scale, 3 * scale * 0.2) / 2)  # N* = B here, in batches of 2


def test_a_teacher_stage_score_on_every_probe_is_used_as_is() -> None:
    client = _client(Controller())
    runner = Fixed({4: 0.9, 8: 0.95})
    _ready(client, runner)
    client.score = lambda ids, mask, routes: pytest.fail("probes scored by a teacher stage are not scored again")
    client.audit(1, wait=True)
    (job,) = runner.jobs
    batch = job.batch
    assert torch.all(batch.teacher_logprobs[batch.response_mask == 0] == 0)
    assert batch.behavior_logprobs is not None and job.settings is client.settings


@pytest.mark.parametrize("where", ["math", "controller"])
def test_a_non_finite_audit_keeps_the_window_on_every_path(api, where: str) -> None:
    client = _client(api)
    if where == "math":
        runner = Fixed({}, error=NonFiniteAuditError("gram has non-finite entries"))
    else:  # the controller refuses it (NonFiniteAudit, 422 over HTTP, mapped back to the class by its name)
        runner = Fixed({4: float("nan"), 8: 0.9})
    _ready(client, runner)
    m = client.audit(1, wait=True)
    assert m["audit/rejected"] == 1.0 and "audit/next_window" not in m and client.counts["rejected"] == 1
    assert api.get_window(client.run_id, 2).window == CANDS[-1]


def test_an_unknown_candidate_is_a_bug_that_propagates_not_a_rejected_audit(api) -> None:
    client = _client(api)
    _ready(client, Fixed({3: 0.9}))
    with pytest.raises(InvalidInput) as err:
        client.audit(1, wait=True)
    assert "unknown candidates" in str(err.value) and client.counts["rejected"] == 0


def test_an_audit_schedule_consumes_skipped_batches_unaudited() -> None:
    client = _client(Controller())
    runner = Fixed({4: 0.9, 8: 0.95})
    _ready(client, runner)
    client.schedule = audit_schedule(AuditConfig(every=2), threshold=0.5)
    first = client.audit(1, wait=True)  # every=2: the first ready batch is audited, the next one skipped
    for i, pid in enumerate(("c", "d")):
        client.complete(_fresh(client, pid, 1, seed=10 + i), 1)
    second = client.audit(2, wait=True)
    assert first.get("audit/submitted") == 1.0 and second.get("audit/skipped") == 1.0 and len(runner.jobs) == 1
    assert len(client.pool) == 0


def test_offer_complete_now_offers_only_rollouts_that_need_no_rounds() -> None:
    client = _client(Controller())
    client.offer_finished = "always"
    records = [Probe(f"t{i}", [1], [5] * n, [0] * n, [-1.0] * n, prompt_id="p") for i, n in enumerate((3, 8, MAX_LEN))]
    accepted = client.offer(0, records, [True, False, False], [8, 8, 8], complete_now=True)
    assert accepted == ["t0", "t2"]  # ended, at the horizon; t1 (cut by the window) would need rounds
    assert client.counts["reported"] == 2 and sorted(p.probe_id for p in client.pool.snapshot()) == ["t0", "t2"]


def test_the_audit_settings_are_the_config_s_and_the_defaults_agree() -> None:
    cfg = load_config(None, {"audit.ci_level": 0.8, "audit.estimator": "debiased", "audit.params": "top:1",
                             "audit.macro": True, "probes.is_method": "clip", "optim.micro_batch_size": 2})
    s = run_audit_settings(cfg)
    assert (s.ci_level, s.estimator, s.params, s.macro, s.is_method, s.micro_batch) == (0.8, "debiased", "top:1", True,
                                                                                        "clip", 2)
    defaults = {f.name: f.default for f in dataclasses.fields(AuditSettings)}
    from_config = dataclasses.asdict(audit_settings(AuditConfig(), CANDS))
    differ = {k for k in defaults if k not in ("candidates", "extra", "sketch_dim") and defaults[k] != from_config[k]}
    assert not differ, f"AuditSettings defaults drifted from AuditConfig's: {sorted(differ)}"


def test_no_probes_module_reaches_into_another_objects_private_members() -> None:
    """The client's collaborators (conversation, decision record, expiry, held batches) keep their own state: no
    module of the package reads or writes another object's ``_private`` members, or imports a ``_private`` name."""
    import ast
    from pathlib import Path

    import adwin.probes

    reaches = []
    for f in sorted(Path(adwin.probes.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                reaches.append(f"{f.name}:{node.lineno} {ast.unparse(node)}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("adwin"):
                reaches += [f"{f.name}:{node.lineno} imports {a.name}" for a in node.names
                            if a.name.startswith("_") and not a.name.startswith("__")]
    assert reaches == []
