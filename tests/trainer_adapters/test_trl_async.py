"""TRL's real ``AsyncDistillationTrainer`` with adwin's rollout worker (``AdwinRolloutWorker``) and ``AdwinCallback``,
on CPU with tiny code-built models, generating on a stand-in of the student's vLLM server and scoring on a teacher
server (``adwin teacher serve``), both on 127.0.0.1: requests carry the window as ``max_tokens``, probe rows reach
full length scored by the teacher server and are never trained on, a dead controller leaves the last window, a bad
window answer is a typed error that loses nothing, staleness is one limit in weight syncs, TRL's default
``token_budget=None`` runs, a padded teacher served on the student's vocabulary trains as the unpadded one, and the
documented recipe runs."""

from __future__ import annotations

import copy
import functools
import inspect
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import make_tiny_llama
from transformers import TrainerCallback
from trl_fixtures import MAX_LEN, async_servers, chat_prompts, chat_tokenizer, make_async_trainer, rows

from adwin.audit.alignment import audit
from adwin.config import AuditConfig
from adwin.controller import Controller
from adwin.controller.app import serve_in_thread
from adwin.controller.remote import RemoteController
from adwin.controller.schemas import PolicyIn, RunIn, WindowOut
from adwin.probes.client import InlineAuditor
from adwin.trainer_adapters.generic import pack

pytest.importorskip("datasets")
pytest.importorskip("aiohttp")
pytest.importorskip("trl.experimental.async_distillation")

from adwin.trainer_adapters import trl_async_driver  # noqa: E402
from adwin.trainer_adapters.hooks import BadWindowAnswer  # noqa: E402
from adwin.trainer_adapters.trl import AdwinCallback  # noqa: E402
from adwin.trainer_adapters.trl_async import (  # noqa: E402
    AdwinRolloutWorker,
    RolloutWorkerFailed,
    TeacherVocabTooWide,
    UnsupportedSetting,
)

pytestmark = [pytest.mark.timeout(300)]

STEPS, P = 4, 4
VOCAB = 64  # make_tiny_llama's: the student's output width
DOC = Path(__file__).resolve().parents[2] / "docs" / "trl-async.md"


@pytest.fixture
def servers(tmp_path: Path) -> Any:
    with async_servers(tmp_path) as s:
        yield s


class Recorder:
    """What the worker planned and emitted, and what the callback audited (wrapping the instances' own calls)."""

    def __init__(self, cb: AdwinCallback, monkeypatch: pytest.MonkeyPatch | None = None) -> None:
        worker = cb.driver.worker
        self.plans: list[tuple[int, Any]] = []  # (version, RequestPlan)
        self.samples: list[Any] = []  # TRL RolloutSamples put on the trainer's queue
        self.probes: list[Any] = []  # probe rows (StreamItem)
        self.jobs: list[tuple[Any, dict]] = []  # (AuditJob, the student's weights it ran under)
        plan, put, probe_put = worker.hooks.plan_request, worker.rollout_buffer.put, worker.probe_rows.put

        def planned(rid: str, pid: str, version: int) -> Any:
            out = plan(rid, pid, version)
            self.plans.append((version, out))
            return out

        worker.hooks.plan_request = planned
        worker.rollout_buffer.put = lambda s, *a, **k: (self.samples.append(s), put(s, *a, **k))[1]
        worker.probe_rows.put = lambda s, *a, **k: (self.probes.append(s), probe_put(s, *a, **k))[1]
        if monkeypatch is not None:
            jobs = self.jobs

            class Recording(InlineAuditor):
                def submit_audit(self, job: Any) -> Any:
                    jobs.append((job, copy.deepcopy(self.model.state_dict())))
                    return super().submit_audit(job)

            monkeypatch.setattr(trl_async_driver, "InlineAuditor", Recording)


def _attach(tmp_path: Path, servers: Any, ctrl: Any, run: str | RunIn = "async", *, steps: int = STEPS,
            threshold: float = 0.7, audit: AuditConfig | None = None,
            **args: Any) -> tuple[Any, AdwinCallback, AdwinRolloutWorker]:
    worker = AdwinRolloutWorker()
    trainer = make_async_trainer(tmp_path, steps, servers, worker, **({"max_staleness": 1} | args))
    cb = AdwinCallback(ctrl, run, candidates=None if isinstance(run, RunIn) else [4, 8], threshold=threshold,
                       probe_count=P, audit=audit or AuditConfig(budget=None), drain_timeout_s=2.0).attach(trainer)
    return trainer, cb, worker


def _runs(seq: list[int]) -> list[int]:
    return [w for i, w in enumerate(seq) if i == 0 or w != seq[i - 1]]


@pytest.mark.parametrize("threshold", [0.05, 1.0])  # the first audit shrinks the window to 4 / grows it to the horizon
def test_requests_carry_the_window_as_max_tokens_to_trls_server(tmp_path: Path, servers: Any,
                                                                  threshold: float) -> None:
    trainer, cb, worker = _attach(tmp_path, servers, Controller(), threshold=threshold)
    rec = Recorder(cb)
    trainer.train()
    assert trainer.state.global_step == STEPS
    decided = [d.decision.window for d in cb.decisions if d.decision is not None]
    assert decided and decided[0] != 8, "the first audit moved the window off the initial 8"
    expected = _runs([8, *decided])
    planned = _runs([p.window for _, p in rec.plans])
    assert planned == expected[: len(planned)] and len(planned) >= 2, "the requests' cap followed every decision"
    sent = [r["max_tokens"] for r in servers.student.requests]  # what reached the student's server
    assert Counter(sent) <= Counter(p.max_tokens for _, p in rec.plans), "each request carried its planned cap"
    assert set(sent) >= {8, decided[0]} and set(sent) <= {4, 8, MAX_LEN}
    for s in rec.samples:  # what TRL trains on: at most the window it was generated under
        assert 1 <= int(s.completion_mask.sum()) <= s.metrics["window/rollout"]
    logged = rows(trainer)
    assert decided[0] in [r["window/rollout"] for r in logged], "TRL trained on rows generated at the decided window"
    assert [r["window/size"] for r in logged] == [float(cb.windows[t]) for t in range(STEPS)]
    assert servers.student.pauses >= STEPS, "TRL's weight sync paused the server every step"


def test_probe_rows_reach_full_length_scored_by_trls_teacher_server_and_are_never_trained_on(
        tmp_path: Path, servers: Any) -> None:
    trainer, cb, _ = _attach(tmp_path, servers, Controller())
    rec = Recorder(cb)
    trainer.train()
    assert rec.probes, "the worker sent probes"
    teacher = make_tiny_llama(seed=1)  # the served teacher (trl_fixtures.save_teacher)
    for item in rec.probes:
        assert item.is_probe and item.max_tokens == MAX_LEN
        assert len(item.tokens) == MAX_LEN or item.finish_reason == "eos"
        assert item.token_versions == [item.submitted_version] * len(item.tokens)
        seq = torch.tensor([item.prompt_ids + item.tokens])
        with torch.no_grad():
            logp = torch.log_softmax(teacher(seq).logits[0].float(), dim=-1)  # (L, V)
        n = len(item.prompt_ids)
        mine = [float(logp[n - 1 + j, t]) for j, t in enumerate(item.tokens)]
        assert item.teacher_logprobs == pytest.approx(mine, abs=1e-4), "the teacher server's realized-token logprobs"
    assert any(len(item.tokens) == MAX_LEN for item in rec.probes)
    assert MAX_LEN in {r["max_tokens"] for r in servers.student.requests}, "probes reached the server at the horizon"
    trained_ids = {s.prompt_id for s in rec.samples}
    probe_ids = {int(item.request_id.removeprefix("trl-")) for item in rec.probes}
    assert not trained_ids & probe_ids, "a probe row reached TRL's queue"
    assert cb.driver.probe_rows == len(rec.probes) - cb.driver.worker.probe_rows.qsize()
    assert cb.decisions and rows(trainer)[-1]["probe/audits"] == float(len(cb.decisions))


@pytest.mark.numerics
def test_the_callbacks_audit_cosines_are_adwins_audit_of_the_served_rows(tmp_path: Path, servers: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # 4 steps, not 3: probes complete on the stand-in server's clock, so 3 steps audited only once on a busy machine
    trainer, cb, _ = _attach(tmp_path, servers, Controller(), steps=4)
    rec = Recorder(cb, monkeypatch)
    trainer.train()
    assert len(rec.jobs) == len(cb.decisions) >= 2
    _assert_audits_are_adwins_of_the_unpadded_teacher(rec, cb)


@functools.cache
def _unpadded_teacher() -> Any:
    return make_tiny_llama(seed=1)  # the served teacher (trl_fixtures.save_teacher), unpadded


def _unpadded_teacher_logprobs(ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L, VOCAB) log-softmax of the unpadded teacher, in process."""
    with torch.no_grad():
        return torch.log_softmax(_unpadded_teacher()(ids, attention_mask=mask).logits.float(), dim=-1)


def _assert_audits_are_adwins_of_the_unpadded_teacher(rec: Recorder, cb: AdwinCallback) -> None:
    """Every audit the callback ran has the cosines adwin's own audit gives on the same probe rows scored by the
    unpadded teacher in process, under the student's weights of that audit."""
    by_tokens = {tuple(item.prompt_ids + item.tokens): item for item in rec.probes}
    cfg = AuditConfig()

    def score(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # (B, L) realized-token logprobs, in process
        logp = _unpadded_teacher_logprobs(ids, mask)  # (B, L, V)
        out = torch.zeros(ids.shape)
        out[:, 1:] = logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
        return out

    for (job, weights), out in zip(rec.jobs, cb.decisions, strict=True):
        items = [by_tokens[tuple(ids[mask.bool()].tolist())]
                 for ids, mask in zip(job.batch.input_ids, job.batch.attention_mask, strict=True)]
        batch = pack([i.prompt_ids for i in items], [i.tokens for i in items], score, pad_id=0)
        model = make_tiny_llama(seed=5)
        model.load_state_dict(weights)
        mine = audit(model, batch, [4, 8], method=cfg.method, metric=cfg.metric, macro=cfg.macro,
                     estimator=cfg.estimator)
        assert out.cosines is not None and set(out.cosines) == {4, 8}
        for c in (4, 8):
            assert abs(out.cosines[c] - mine.cosines[c]) <= 1e-5


@pytest.mark.numerics
@pytest.mark.parametrize("served", [VOCAB, None])  # --vocab-size: the student's columns / all the teacher's rows
def test_a_padded_teacher_served_on_the_students_vocabulary_trains_as_the_unpadded_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, served: int | None) -> None:
    """A teacher with 32 output rows past the student's vocabulary, large enough to take most of a softmax's mass:
    served on the student's columns, TRL trains on the unpadded teacher's top-k and the audits read its logprobs;
    served whole, the worker stops at the first row, before TRL's loss indexes past the student's logits."""
    with async_servers(tmp_path, teacher_rows=VOCAB + 32, vocab=served) as servers:
        trainer, cb, _ = _attach(tmp_path, servers, Controller(), steps=2)
        rec = Recorder(cb, monkeypatch)
        if served is None:
            with pytest.raises(RolloutWorkerFailed) as err:
                trainer.train()
            assert isinstance(err.value.__cause__, TeacherVocabTooWide)
            assert trainer.state.global_step == 0 and rec.samples == [], "nothing trained on the wide teacher"
            return
        trainer.train()
    assert trainer.state.global_step == 2 and rec.samples and rec.probes
    for item in rec.probes:  # the realized tokens' logprobs the audits read
        logp = _unpadded_teacher_logprobs(torch.tensor([item.prompt_ids + item.tokens]))[0]  # (L, VOCAB)
        n = len(item.prompt_ids)
        mine = [float(logp[n - 1 + j, t]) for j, t in enumerate(item.tokens)]
        assert item.teacher_logprobs == pytest.approx(mine, abs=1e-5)
    k = trainer.args.teacher_top_k
    for s in rec.samples:  # the top-k TRL's loss trains on: row i scores input_ids[i] given the tokens before it
        logp = _unpadded_teacher_logprobs(torch.tensor([s.input_ids.tolist()]))[0]  # (L, VOCAB)
        for i in range(int(len(s.input_ids) - s.completion_mask.sum()), len(s.input_ids)):
            ids = s.teacher_topk_ids[i][s.teacher_topk_ids[i] >= 0]
            assert set(ids.tolist()) == set(logp[i - 1].topk(k).indices.tolist()) | {int(s.input_ids[i])}
            assert s.teacher_topk_logprobs[i][: len(ids)] == pytest.approx(logp[i - 1, ids].tolist(), abs=1e-5)
    assert len(rec.jobs) == len(cb.decisions) >= 1
    _assert_audits_are_adwins_of_the_unpadded_teacher(rec, cb)


class _StopAt(TrainerCallback):
    def __init__(self, at: int, stop: Any) -> None:
        self.at, self.stop = at, stop

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.at:
            self.stop()


def test_a_dead_controller_degrades_to_the_last_window(tmp_path: Path, servers: Any) -> None:
    ctrl = Controller()
    url, stop = serve_in_thread(ctrl, "127.0.0.1", 0)
    api = RemoteController(url, retries=0, timeout=5.0)
    try:
        trainer, cb, _ = _attach(tmp_path, servers, api, steps=5, threshold=1.0)
        rec = Recorder(cb)
        trainer.callback_handler.callbacks.insert(0, _StopAt(2, stop))  # before TRL's and adwin's step-end work
        trainer.train()
    finally:
        stop()
        api.close()
        ctrl.close()
    assert trainer.state.global_step == 5, "training finished through the outage"
    last = cb.windows[2]
    assert [cb.windows[t] for t in (3, 4)] == [last, last]
    assert all(p.window == last for v, p in rec.plans if v >= 3)
    logged = rows(trainer)
    assert logged[0]["controller/degraded"] == 0.0 and logged[2]["controller/degraded"] > 0
    assert logged[-1]["probe/accepted"] == logged[1]["probe/accepted"], "no probe taken while the controller is away"


class _BadAnswerAt(Controller):
    """An in-process controller whose window answer at one version is outside [1, max_len]."""

    def __init__(self, bad_at: int, value: int) -> None:
        super().__init__()
        self.bad_at, self.value = bad_at, value

    def get_window(self, run_id: str, step: int) -> WindowOut:
        out = super().get_window(run_id, step)
        return out.model_copy(update={"window": self.value}) if step == self.bad_at else out


@pytest.mark.parametrize("value", [0, MAX_LEN + 1])
def test_a_bad_window_answer_is_a_typed_error_that_loses_nothing(tmp_path: Path, servers: Any, value: int) -> None:
    ctrl = _BadAnswerAt(1, value)  # where the first audit's decision (threshold 1.0: the horizon) is read
    trainer, cb, _ = _attach(tmp_path, servers, ctrl, threshold=1.0)
    rec = Recorder(cb)
    trainer.train()
    errors = cb.driver.window_errors
    assert len(errors) == 1 and isinstance(errors[0], BadWindowAnswer) and f"window {value}" in str(errors[0])
    assert trainer.state.global_step == STEPS and all(1 <= p.window <= MAX_LEN for _, p in rec.plans)
    decided = cb.decisions[0].decision
    assert decided is not None and decided.window != cb.windows[0]
    assert cb.windows[1] == cb.windows[0], "the bad answer (read after step 0) kept the last window"
    assert cb.windows[2] == decided.window, "the next good answer was applied"
    counts = cb.driver.hooks.counts
    held = len(cb.driver.hooks.client.pool) + cb.driver.worker.probe_rows.qsize()
    in_flight = sum(p.is_probe for _, p in rec.plans) - len(rec.probes)  # on the server when training stopped
    assert counts["accepted"] == counts["audits"] * P + held + counts["expired"] + in_flight, \
        "every probe audited, held, or still generating"
    assert rows(trainer)[-1]["window/bad_answers"] == 1.0


def test_a_bad_first_window_fails_at_attach_before_the_worker_is_bound(tmp_path: Path, servers: Any) -> None:
    with pytest.raises(BadWindowAnswer, match="window 0 at version 0"):
        _attach(tmp_path, servers, _BadAnswerAt(0, 0))


def test_staleness_is_one_limit_in_weight_syncs(tmp_path: Path, servers: Any) -> None:
    ctrl = Controller()
    # two optimizer steps a sync: TRL's max_staleness=2 is 2 syncs, and so is the run's limit (not 4 steps)
    _, cb, _ = _attach(tmp_path / "a", servers, ctrl, "trl-tighter", max_staleness=2, weight_sync_steps=2)
    assert ctrl.get_run("trl-tighter").spec["staleness_limit"] == 2 == cb.driver.hooks.client.staleness_limit
    spec = RunIn(run_id="adwin-tighter", policy=PolicyIn(candidates=[4, 8], max_len=MAX_LEN), probe_batch_size=P,
                 offers_per_step=P, staleness_limit=2)
    trainer, cb, _ = _attach(tmp_path / "b", servers, ctrl, spec, max_staleness=4, weight_sync_steps=2)
    assert trainer.args.max_staleness == 2 and cb.driver.hooks.client.staleness_limit == 2
    ctrl.register_run(spec.model_copy(update={"run_id": "looser", "staleness_limit": 5}))
    with pytest.raises(UnsupportedSetting, match="looser than TRL's max_staleness=2") as err:
        AdwinCallback(ctrl, "looser", probe_count=P).attach(
            make_async_trainer(tmp_path / "c", 1, servers, max_staleness=2))
    assert err.value.field == "staleness_limit"


def test_versions_are_trls_weight_syncs_and_the_window_changes_only_at_a_sync(tmp_path: Path, servers: Any) -> None:
    trainer, cb, _ = _attach(tmp_path, servers, Controller(), steps=4, threshold=1.0, max_staleness=2,
                             weight_sync_steps=2)
    rec = Recorder(cb)
    trainer.train()
    assert trainer.model_version == 1 + 4 // 2, "TRL's cold sync, then one sync every two steps"
    versions = {v for v, _ in rec.plans}
    assert versions <= {0, 1, 2} and 0 in versions, "requests are planned at TRL's model_version - 1"
    for s in rec.samples:
        assert s.model_version - 1 in versions
    assert cb.windows[0] == cb.windows[1], "no sync after step 0: the window of that phase stays"
    assert trainer.state.global_step == 4


def test_trls_default_token_budget_none_is_read_from_the_students_server(tmp_path: Path, servers: Any) -> None:
    from trl.experimental.async_distillation import AsyncDistillationConfig

    default = AsyncDistillationConfig(output_dir=str(tmp_path / "d"), use_cpu=True, bf16=False)
    assert default.token_budget is None, "TRL's default"
    trainer, cb, _ = _attach(tmp_path, servers, Controller(), steps=2, token_budget=None)
    trainer.train()
    assert trainer.args.token_budget == servers.student.max_model_len, "TRL asked the stand-in's max_model_len"
    assert trainer.state.global_step == 2 and cb.windows


def test_settings_the_worker_cannot_honour_are_refused_naming_the_field(tmp_path: Path, servers: Any) -> None:
    trainer = make_async_trainer(tmp_path, 1, servers, log_completions=True)
    ctrl = Controller()
    with pytest.raises(UnsupportedSetting, match="log_completions") as err:
        AdwinCallback(ctrl, "logc", candidates=[4, 8], probe_count=P).attach(trainer)
    assert err.value.field == "log_completions"
    assert ctrl.list_runs() == [] and not any(isinstance(c, AdwinCallback) for c in trainer.callback_handler.callbacks)
    assert servers.student.requests == [], "nothing was sent"


def _doc_block() -> str:
    match = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert match is not None, "docs/trl-async.md lost the python block of the recipe"
    return match.group(1)


def test_the_documented_recipe_runs_verbatim_and_audits(tmp_path: Path, servers: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer_fixtures import save_tiny
    from trl.experimental.async_distillation import async_distillation_trainer as adt
    from vllm_standin import StandInWeights

    monkeypatch.chdir(tmp_path)  # the block writes to output_dir="out"
    monkeypatch.setattr(adt, "get_peak_flops_per_device", lambda *args: None)  # CUDA-only query
    # TRL's default weight transfer is NCCL into vLLM's workers, which needs GPUs: the stand-in's, in its place
    monkeypatch.setattr(adt, "WeightTransferClient", lambda **kw: StandInWeights(servers.student, servers.student_url))
    ns = {"student_path": str(save_tiny(tmp_path / "s", seed=0, with_tokenizer=False)),
          "tokenizer": chat_tokenizer(), "dataset": chat_prompts(32), "max_len": MAX_LEN, "candidates": [4, 8],
          "steps": 3, "student_url": servers.student_url, "teacher_url": servers.teacher_url,
          "extra": {"use_cpu": True, "bf16": False, "model_init_kwargs": {"attn_implementation": "sdpa"},
                    "token_budget": 0, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 4}}
    exec(compile(_doc_block(), str(DOC), "exec"), ns)  # noqa: S102
    trainer, callback = ns["trainer"], ns["callback"]
    assert trainer.state.global_step == 3 and isinstance(trainer.rollout_worker, AdwinRolloutWorker)
    assert callback.decisions, "the documented setup audits"
    assert all(r["window/size"] in (4.0, 8.0, float(MAX_LEN)) for r in rows(trainer))
    assert {r["max_tokens"] for r in servers.student.requests} >= {8, MAX_LEN}


def test_a_failure_on_the_workers_thread_stops_training_with_a_typed_error(tmp_path: Path, servers: Any) -> None:
    trainer, cb, worker = _attach(tmp_path, servers, Controller())

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("controller lost")

    worker.hooks.plan_request = broken
    with pytest.raises(RolloutWorkerFailed, match="RuntimeError: controller lost") as err:
        trainer.train()  # TRL's queue poll (5 s) asks the worker's health
    assert isinstance(err.value.__cause__, RuntimeError)


def test_the_trl_calls_the_worker_relies_on_keep_their_shape() -> None:
    """Drift guard: TRL's per-sample path builds the student request from the loop's ``max_tokens`` before its
    first await (so a cap set just before the call is that request's), and its rollout worker protocol is the one
    the worker implements."""
    from trl.experimental.async_distillation import async_distillation_trainer as adt
    from trl.experimental.async_distillation import async_rollout_worker as arw

    one = inspect.getsource(arw._AsyncRolloutLoop._generate_and_score_one)
    assert one.index("await self._generate_one_turn(") == one.index("await ")
    turn = inspect.getsource(arw._AsyncRolloutLoop._generate_one_turn)
    assert '"max_tokens": self.max_tokens' in turn and turn.index('"max_tokens"') < turn.index("await ")
    protocol = {n for n in vars(adt.RolloutWorkerProtocol) if not n.startswith("_")}
    protocol |= set(adt.RolloutWorkerProtocol.__annotations__)
    assert protocol <= set(dir(AdwinRolloutWorker()))
