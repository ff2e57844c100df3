"""TRL's real ``AsyncDistillationTrainer`` with adwin's rollout worker (``AdwinRolloutWorker``) and ``AdwinCallback``,
on CPU with tiny code-built models: windows move on audits, probe rows reach full length and are never trained on,
the audit's cosines are adwin's own audit of the same rows, a dead controller leaves the last window, a bad window
answer is a typed error that loses nothing, staleness is the tighter limit, and the documented recipe runs."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import make_tiny_llama
from transformers import TrainerCallback
from trl_fixtures import MAX_LEN, make_async_trainer, prompts, rows, tokenizer

from adwin.audit.alignment import audit
from adwin.config import AuditConfig
from adwin.controller import Controller
from adwin.controller.app import serve_in_thread
from adwin.controller.remote import RemoteController
from adwin.controller.schemas import PolicyIn, RunIn, WindowOut
from adwin.probes.client import InlineAuditor
from adwin.trainer_adapters.generic import pack, teacher_scorer

pytest.importorskip("datasets")
pytest.importorskip("trl.experimental.async_distillation")

from adwin.trainer_adapters import trl_async_driver  # noqa: E402
from adwin.trainer_adapters.hooks import BadWindowAnswer  # noqa: E402
from adwin.trainer_adapters.trl import AdwinCallback  # noqa: E402
from adwin.trainer_adapters.trl_async import AdwinRolloutWorker, RolloutWorkerFailed, teacher_topk  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("trl_vllm_client")]

STEPS, P = 4, 4
DOC = Path(__file__).resolve().parents[2] / "docs" / "adapters.md"


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


def _attach(tmp_path: Path, ctrl: Any, run: str | RunIn = "async", *, steps: int = STEPS, threshold: float = 0.7,
            audit: AuditConfig | None = None, **args: Any) -> tuple[Any, AdwinCallback, AdwinRolloutWorker]:
    worker = AdwinRolloutWorker(make_tiny_llama(seed=1))
    trainer = make_async_trainer(tmp_path, steps, worker, **({"max_staleness": 1} | args))
    cb = AdwinCallback(ctrl, run, candidates=None if isinstance(run, RunIn) else [4, 8], threshold=threshold,
                       probe_count=P, audit=audit or AuditConfig(budget=None), drain_timeout_s=2.0).attach(trainer)
    return trainer, cb, worker


def _runs(seq: list[int]) -> list[int]:
    return [w for i, w in enumerate(seq) if i == 0 or w != seq[i - 1]]


@pytest.mark.parametrize("threshold", [0.05, 1.0])  # the first audit shrinks the window to 4 / grows it to the horizon
def test_windows_move_on_audits_and_trl_trains_rows_capped_at_them(tmp_path: Path, threshold: float) -> None:
    trainer, cb, worker = _attach(tmp_path, Controller(), threshold=threshold)
    rec = Recorder(cb)
    trainer.train()
    assert trainer.state.global_step == STEPS
    decided = [d.decision.window for d in cb.decisions if d.decision is not None]
    assert decided and decided[0] != 8, "the first audit moved the window off the initial 8"
    expected = _runs([8, *decided])
    planned = _runs([p.window for _, p in rec.plans])
    assert planned == expected[: len(planned)] and len(planned) >= 2, "the requests' cap followed every decision"
    train = [p for _, p in rec.plans if not p.is_probe]
    assert all(p.max_tokens == p.window for p in train)
    for s in rec.samples:  # what TRL trains on: at most the window it was generated under
        assert 1 <= int(s.completion_mask.sum()) <= s.metrics["window/rollout"]
    logged = rows(trainer)
    assert decided[0] in [r["window/rollout"] for r in logged], "TRL trained on rows generated at the decided window"
    assert [r["window/size"] for r in logged] == [float(cb.windows[t]) for t in range(STEPS)]


def test_probe_rows_reach_full_length_and_are_never_trained_on(tmp_path: Path) -> None:
    trainer, cb, _ = _attach(tmp_path, Controller())
    rec = Recorder(cb)
    trainer.train()
    assert rec.probes, "the worker sent probes"
    for item in rec.probes:
        assert item.is_probe and item.max_tokens == MAX_LEN
        assert len(item.tokens) == MAX_LEN or item.finish_reason == "eos"
        assert item.token_versions == [item.submitted_version] * len(item.tokens)
    assert any(len(item.tokens) == MAX_LEN for item in rec.probes)
    trained_ids = {s.prompt_id for s in rec.samples}
    probe_ids = {int(item.request_id.removeprefix("trl-")) for item in rec.probes}
    assert not trained_ids & probe_ids, "a probe row reached TRL's queue"
    assert cb.driver.probe_rows == len(rec.probes) - cb.driver.worker.probe_rows.qsize()
    assert cb.decisions and rows(trainer)[-1]["probe/audits"] == float(len(cb.decisions))


@pytest.mark.numerics
def test_the_callbacks_audit_cosines_are_adwins_own_audit_of_the_same_rows(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    trainer, cb, worker = _attach(tmp_path, Controller(), steps=3)
    rec = Recorder(cb, monkeypatch)
    trainer.train()
    assert len(rec.jobs) == len(cb.decisions) >= 2
    by_tokens = {tuple(item.prompt_ids + item.tokens): item for item in rec.probes}
    cfg, temperature = AuditConfig(), float(trainer.args.teacher_temperature)
    for (job, weights), out in zip(rec.jobs, cb.decisions, strict=True):
        items = [by_tokens[tuple(ids[mask.bool()].tolist())]
                 for ids, mask in zip(job.batch.input_ids, job.batch.attention_mask, strict=True)]
        batch = pack([i.prompt_ids for i in items], [i.tokens for i in items],
                     teacher_scorer(worker.teacher, temperature=temperature), pad_id=0)
        model = make_tiny_llama(seed=5)
        model.load_state_dict(weights)
        mine = audit(model, batch, [4, 8], method=cfg.method, metric=cfg.metric, macro=cfg.macro,
                     estimator=cfg.estimator)
        assert out.cosines is not None and set(out.cosines) == {4, 8}
        for c in (4, 8):
            assert abs(out.cosines[c] - mine.cosines[c]) <= 1e-6


def test_teacher_topk_is_trls_sparse_layout_of_the_teachers_distribution() -> None:
    teacher = make_tiny_llama(seed=1)
    prompt, completion = [5, 6, 7], [8, 9, 2]
    (ids, lps), = teacher_topk(teacher, [prompt], [completion], k=3, temperature=2.0, pad_id=0)
    assert ids.shape == lps.shape == (6, 4)
    assert (ids[:3] == -1).all() and torch.isinf(torch.as_tensor(lps[:3])).all()
    with torch.no_grad():
        full = torch.log_softmax(teacher(torch.tensor([prompt + completion])).logits[0] / 2.0, dim=-1)  # (L, V)
    for j, tok in enumerate(completion):
        row = full[len(prompt) - 1 + j]  # the distribution completion token j was drawn at
        top = row.topk(3)
        assert ids[3 + j, :3].tolist() == top.indices.tolist()
        assert torch.allclose(torch.as_tensor(lps[3 + j, :3]), top.values, atol=1e-5)
        listed = ids[3 + j].tolist()
        assert tok in listed  # the realized token is always a candidate
        assert abs(float(lps[3 + j, listed.index(tok)]) - float(row[tok])) <= 1e-5


class _StopAt(TrainerCallback):
    def __init__(self, at: int, stop: Any) -> None:
        self.at, self.stop = at, stop

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.at:
            self.stop()


def test_a_dead_controller_degrades_to_the_last_window(tmp_path: Path) -> None:
    ctrl = Controller()
    url, stop = serve_in_thread(ctrl, "127.0.0.1", 0)
    api = RemoteController(url, retries=0, timeout=5.0)
    try:
        trainer, cb, _ = _attach(tmp_path, api, steps=5, threshold=1.0)
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
def test_a_bad_window_answer_is_a_typed_error_that_loses_nothing(tmp_path: Path, value: int) -> None:
    ctrl = _BadAnswerAt(1, value)  # where the first audit's decision (threshold 1.0: the horizon) is read
    trainer, cb, _ = _attach(tmp_path, ctrl, threshold=1.0)
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
    assert counts["accepted"] == counts["audits"] * P + held + counts["expired"], "every probe audited or held"
    assert "sample/dropped_stale_total" not in "".join(map(str, rows(trainer)))
    assert rows(trainer)[-1]["window/bad_answers"] == 1.0


def test_a_bad_first_window_fails_at_attach_before_the_worker_is_bound(tmp_path: Path) -> None:
    with pytest.raises(BadWindowAnswer, match="window 0 at version 0"):
        _attach(tmp_path, _BadAnswerAt(0, 0))


def test_staleness_is_the_tighter_of_trls_max_staleness_and_adwins_limit(tmp_path: Path) -> None:
    ctrl = Controller()
    _, cb, _ = _attach(tmp_path / "a", ctrl, "trl-tighter", max_staleness=2)  # adwin's default S = 5
    assert ctrl.get_run("trl-tighter").spec["staleness_limit"] == 2 == cb.driver.hooks.client.staleness_limit
    spec = RunIn(run_id="adwin-tighter", policy=PolicyIn(candidates=[4, 8], max_len=MAX_LEN), probe_batch_size=P,
                 offers_per_step=P, staleness_limit=2)
    trainer, cb, _ = _attach(tmp_path / "b", ctrl, spec, max_staleness=4)
    assert trainer.args.max_staleness == 2 and cb.driver.hooks.client.staleness_limit == 2
    ctrl.register_run(spec.model_copy(update={"run_id": "looser", "staleness_limit": 5}))
    with pytest.raises(ValueError, match="staleness_limit=5 is looser than TRL's max_staleness=2"):
        AdwinCallback(ctrl, "looser", probe_count=P).attach(
            make_async_trainer(tmp_path / "c", 1, AdwinRolloutWorker(make_tiny_llama(seed=1)), max_staleness=2))


def test_sampling_settings_adwins_sampler_lacks_are_refused_naming_the_field(tmp_path: Path) -> None:
    worker = AdwinRolloutWorker(make_tiny_llama(seed=1))
    trainer = make_async_trainer(tmp_path, 1, worker, top_k=5)
    ctrl = Controller()
    with pytest.raises(ValueError, match="top_k=5 is not supported"):
        AdwinCallback(ctrl, "topk", candidates=[4, 8], probe_count=P).attach(trainer)
    assert ctrl.list_runs() == [] and not any(isinstance(c, AdwinCallback) for c in trainer.callback_handler.callbacks)


def _doc_block() -> str:
    text = DOC.read_text()
    match = re.search(r"```python\n(.*?)```", text[text.index("### TRL `AsyncDistillationTrainer`"):], re.S)
    assert match is not None, "docs/adapters.md lost the python block of the async TRL recipe"
    return match.group(1)


def test_the_documented_async_recipe_runs_verbatim_and_audits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer_fixtures import save_tiny

    monkeypatch.chdir(tmp_path)  # the block writes to output_dir="out"
    from trl.experimental.async_distillation import async_distillation_trainer as adt

    monkeypatch.setattr(adt, "get_peak_flops_per_device", lambda *args: None)  # CUDA-only query
    ns = {"teacher": make_tiny_llama(seed=1), "student_path": str(save_tiny(tmp_path / "s", seed=0,
                                                                             with_tokenizer=False)),
          "tokenizer": tokenizer(), "dataset": prompts(32), "max_len": MAX_LEN, "candidates": [4, 8], "steps": 3}
    exec(compile(_doc_block(), str(DOC), "exec"), ns)  # noqa: S102
    trainer, callback = ns["trainer"], ns["callback"]
    assert trainer.state.global_step == 3 and isinstance(trainer.rollout_worker, AdwinRolloutWorker)
    assert callback.decisions, "the documented setup audits"
    assert all(r["window/size"] in (4.0, 8.0, float(MAX_LEN)) for r in rows(trainer))


def test_a_failure_on_the_workers_thread_stops_training_with_a_typed_error(tmp_path: Path) -> None:
    trainer, cb, worker = _attach(tmp_path, Controller())

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("teacher lost")

    worker.teacher.forward = broken
    with pytest.raises(RolloutWorkerFailed, match="RuntimeError: teacher lost") as err:
        trainer.train()  # TRL's queue poll (5 s) asks the worker's health
    assert isinstance(err.value.__cause__, RuntimeError)


def test_the_trl_calls_the_worker_relies_on_keep_their_order() -> None:
    """Drift guard: TRL's weight sync resumes the generator, then bumps ``model_version`` and hands it to the worker
    (``AdwinRolloutWorker.load_weights`` stamps rows with that version), and its rollout worker protocol is the one
    the worker implements."""
    import inspect

    from trl.experimental.async_distillation import async_distillation_trainer as adt

    src = inspect.getsource(adt.AsyncDistillationTrainer._sync_weight_merged)
    order = [src.index(s) for s in ("self.weight_transfer.pause()", "self.weight_transfer.send_weights(",
                                     "self.weight_transfer.resume()", "self.model_version += 1",
                                     "self.rollout_worker.update_model_version(self.model_version)")]
    assert order == sorted(order)
    protocol = {n for n in vars(adt.RolloutWorkerProtocol) if not n.startswith("_")}
    protocol |= set(adt.RolloutWorkerProtocol.__annotations__)
    assert protocol <= set(dir(AdwinRolloutWorker(make_tiny_llama(seed=1))))
