"""``AdwinCallback`` on TRL's ``ServerDistillationTrainer`` (no local teacher), against ``adwin teacher serve`` on
127.0.0.1 (started and stopped by the tests), on CPU: the window TRL generates with, probe batches scored by the
server, the audit's decision applied; the teacher budget's count; the refusals (no teacher and no server URL, an
unreachable server, TRL's async distillation trainer)."""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch
from teacher_servers import in_thread
from tiny_models import make_tiny_llama
from transformers import TrainerCallback
from trl_fixtures import MAX_LEN, make_server_trainer, make_trainer, prompts, rows, save_teacher, tokenizer

from adwin.config import AuditConfig
from adwin.controller import Controller
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.probes.settings import param_count
from adwin.teacher.client import ClientSettings, TeacherUnavailable
from adwin.trainer_adapters.generic import teacher_scorer

pytest.importorskip("datasets")
server_distillation = pytest.importorskip("trl.experimental.server_distillation")

from adwin.trainer_adapters.trl import AdwinCallback  # noqa: E402
from adwin.trainer_adapters.trl_teacher import NoTeacher, UnsupportedTrainer  # noqa: E402

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("trl_vllm_client")]

STEPS, BATCH, P = 3, 4, 4
FAST_FAIL = ClientSettings(retries=1, backoff_s=0.05, timeout_s=5.0)  # an unreachable server fails in well under 1 s
DOC = Path(__file__).resolve().parents[2] / "docs" / "adapters.md"


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_teacher(tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="module")
def teacher_root(teacher_path: Path) -> Iterator[str]:
    """The root URL (as TRL takes it) of ``adwin teacher serve``'s app serving the tiny teacher."""
    with in_thread(teacher_path, "tiny-teacher") as url:
        yield url.removesuffix("/v1")


def _scored_rows(root: str) -> int:
    return int(httpx.get(f"{root}/healthz").json()["rows"])


def _doc_block() -> str:
    text = DOC.read_text()
    match = re.search(r"```python\n(.*?)```", text[text.index("### TRL `ServerDistillationTrainer`"):], re.S)
    assert match is not None, "docs/adapters.md lost the python block of the served-teacher TRL recipe"
    return match.group(1)


def test_the_documented_served_teacher_recipe_runs_verbatim_and_audits_with_the_server(
        teacher_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the block writes to output_dir="out"
    block = _doc_block()
    assert "http://127.0.0.1:8480" in block
    ns = {"student": make_tiny_llama(seed=0), "tokenizer": tokenizer(), "dataset": prompts(24), "max_len": MAX_LEN,
          "candidates": [4, 8], "steps": STEPS}
    exec(compile(block.replace("http://127.0.0.1:8480", teacher_root), str(DOC), "exec"), ns)  # noqa: S102
    trainer, callback = ns["trainer"], ns["callback"]
    assert isinstance(trainer, server_distillation.ServerDistillationTrainer) and trainer.teacher_model is None
    assert trainer.state.global_step == STEPS and sorted(callback.windows) == list(range(STEPS))
    assert callback.teacher.url == f"{teacher_root}/v1#tiny-teacher"  # the server and model TRL scores with
    assert callback.decisions, "the documented setup audits"
    logged = rows(trainer)
    assert [r["window/size"] for r in logged] == [float(w) for w in callback.windows.values()]
    assert all(r["completions/max_length"] <= r["window/size"] for r in logged)


@pytest.mark.parametrize("threshold", [0.05, 0.5, 1.0])  # with these seeds the first decision shrinks, keeps, grows
def test_probe_batches_scored_by_the_server_decide_the_next_window(teacher_root: str, tmp_path: Path,
                                                                   threshold: float) -> None:
    trainer = make_server_trainer(tmp_path, teacher_root, STEPS, batch=BATCH)
    before = _scored_rows(teacher_root)
    cb = AdwinCallback(Controller(), "served", candidates=[4, 8], threshold=threshold, probe_count=P,
                       audit=AuditConfig(budget=None)).attach(trainer)  # every ready batch audited
    trainer.train()
    audits = int(cb.client.stats.audits)
    assert audits >= 1
    # TRL scored every rollout, the callback its start-up probe and every audited probe, all at the one server
    assert _scored_rows(teacher_root) - before == STEPS * BATCH + 1 + audits * P
    first = cb.decisions[0]
    assert first.decision is not None and first.decision.reason == "audit"
    cos = first.cosines or {}
    expected = min((c for c in (4, 8) if cos[c] >= threshold), default=MAX_LEN)
    assert first.decision.window == expected
    logged = rows(trainer)
    decided_at = next(i for i, r in enumerate(logged) if "window/next" in r)
    assert decided_at + 1 < len(logged), "the first audit came too late to be applied within the run"
    assert cb.windows[decided_at + 1] == expected  # moved or kept, as the audit decided
    assert logged[decided_at + 1]["completions/max_length"] <= expected  # the cap TRL generated with


def test_the_callbacks_probe_scores_are_the_served_teachers_own(teacher_root: str, tmp_path: Path) -> None:
    trainer = make_server_trainer(tmp_path, teacher_root, 1)
    cb = AdwinCallback(Controller(), "parity", candidates=[4, 8], probe_count=P).attach(trainer)
    ids = torch.randint(3, 60, (3, 12))  # (B, L)
    attn = (torch.arange(12)[None] < torch.tensor([12, 8, 5])[:, None]).long()  # (B, L) right-padded
    served = cb.teacher.score(ids, attn)
    local = teacher_scorer(make_tiny_llama(seed=1))(ids, attn)  # the checkpoint the server loaded
    m = attn.bool()
    m[:, 0] = False
    assert (served - local)[m].abs().max() <= 1e-5


def test_the_decision_budget_charges_the_students_count_for_a_server_unless_told(
        teacher_root: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    trainer = make_server_trainer(tmp_path, teacher_root, 1)
    n_student = param_count(trainer.model)
    with caplog.at_level(logging.WARNING, logger="adwin.trainer_adapters.trl"):
        default = AdwinCallback(Controller(), "b1", candidates=[4, 8], probe_count=P).attach(trainer)
    assert default.client.probe_client.budget.flops.n_teacher == n_student
    assert f"charges the student's count ({n_student})" in caplog.text and teacher_root in caplog.text
    told = AdwinCallback(Controller(), "b2", candidates=[4, 8], probe_count=P, teacher_params=30 * n_student).attach(
        make_server_trainer(tmp_path / "b", teacher_root, 1))
    assert told.client.probe_client.budget.flops.n_teacher == 30 * n_student
    local = AdwinCallback(Controller(), "b3", candidates=[4, 8], probe_count=P).attach(make_trainer(tmp_path / "c", 1))
    assert local.client.probe_client.budget.flops.n_teacher == param_count(local.trainer.teacher_model)
    with pytest.raises(ValueError, match="teacher_params must be >= 1"):
        AdwinCallback(Controller(), "b4", candidates=[4, 8], teacher_params=0)


class _StopServerAtLastStep(TrainerCallback):
    """Added before ``AdwinCallback``: at the last step's end the server goes away, after TRL scored the step's
    rollouts and before the callback's probe cycle scores its probe batch."""

    def __init__(self, server: contextlib.ExitStack, last: int) -> None:
        self.server, self.last = server, last

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.last:
            self.server.close()


def test_a_server_lost_mid_run_closes_the_audit_unaudited_and_keeps_the_window(teacher_path: Path,
                                                                               tmp_path: Path) -> None:
    ctrl = Controller()
    with contextlib.ExitStack() as server:
        url = server.enter_context(in_thread(teacher_path, "tiny-teacher"))
        trainer = make_server_trainer(tmp_path, url.removesuffix("/v1"), 2, batch=BATCH)
        trainer.add_callback(_StopServerAtLastStep(server, last=2))
        cb = AdwinCallback(ctrl, RunIn(run_id="lost", policy=PolicyIn(candidates=[4, 8], max_len=MAX_LEN),
                                       probe_batch_size=P), probe_count=P, audit=AuditConfig(budget=None),
                           teacher_server=FAST_FAIL).attach(trainer)
        trainer.train()
    logged = rows(trainer)
    assert "audit/teacher_unavailable" not in logged[0] and logged[0]["probe/audits"] == 1.0  # the server was up
    assert logged[1]["audit/teacher_unavailable"] == 1.0 and logged[1]["probe/audits"] == 1.0
    assert ctrl.get_window("lost", 2).window == cb.windows[1]  # no decision from the unscored batch


def test_a_trainer_without_teacher_or_server_url_is_refused_before_registering(tmp_path: Path) -> None:
    ctrl = Controller()
    with pytest.raises(NoTeacher, match="no teacher_model and no args.teacher_model_server_url"):
        AdwinCallback(ctrl, "none", candidates=[4, 8], probe_count=P).attach(make_trainer(tmp_path, 1, teacher=False))
    assert ctrl.list_runs() == []


def test_an_unreachable_teacher_server_is_a_typed_error_naming_the_url(teacher_path: Path, tmp_path: Path) -> None:
    with in_thread(teacher_path, "tiny-teacher") as url:
        trainer = make_server_trainer(tmp_path, url.removesuffix("/v1"), 1)  # TRL connects while it is built
    ctrl = Controller()
    t0 = time.perf_counter()
    with pytest.raises(TeacherUnavailable) as err:
        AdwinCallback(ctrl, "gone", candidates=[4, 8], probe_count=P, teacher_server=FAST_FAIL).attach(trainer)
    assert err.value.url == url and url in str(err.value)
    assert time.perf_counter() - t0 < 30
    assert ctrl.list_runs() == [] and not any(isinstance(c, AdwinCallback) for c in trainer.callback_handler.callbacks)


def test_trls_async_distillation_trainer_and_other_trainers_are_refused(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A real ``AsyncDistillationTrainer`` (its rollout worker and weight transfer injected: no vLLM server; its
    CUDA-only peak-FLOPs query patched) is refused at ``attach``, naming why."""
    async_trainer = pytest.importorskip("trl.experimental.async_distillation.async_distillation_trainer")
    from trainer_fixtures import save_tiny

    monkeypatch.setattr(async_trainer, "get_peak_flops_per_device", lambda *args: None)
    worker = SimpleNamespace(rollout_buffer=None, start=lambda: None, stop=lambda: None,
                             update_model_version=lambda v: None, check_health=lambda s: None)
    transfer = SimpleNamespace(init_weight_transfer=lambda: None, pause=lambda: None, send_weights=lambda it: None,
                               resume=lambda: None, destroy=lambda: None)
    args = async_trainer.AsyncDistillationConfig(
        output_dir=str(tmp_path / "out"), max_steps=1, max_completion_length=MAX_LEN, use_cpu=True, bf16=False,
        report_to=[], model_init_kwargs={"attn_implementation": "sdpa"})  # its default needs a flash-attn kernel
    trainer = async_trainer.AsyncDistillationTrainer(
        model=str(save_tiny(tmp_path / "student", seed=0, with_tokenizer=False)), args=args, train_dataset=prompts(4),
        processing_class=tokenizer(), rollout_worker=worker, weight_transfer=transfer)
    ctrl = Controller()
    with pytest.raises(UnsupportedTrainer, match="spawned child process .* max_tokens fixed at start"):
        AdwinCallback(ctrl, "async", candidates=[4, 8]).attach(trainer)
    with pytest.raises(UnsupportedTrainer, match="not SimpleNamespace"):
        AdwinCallback(ctrl, "other", candidates=[4, 8]).attach(SimpleNamespace(args=None))
    assert ctrl.list_runs() == []


def test_the_server_trainer_generates_through_the_attributes_the_callback_sets() -> None:
    """Drift guard: ``ServerDistillationTrainer`` generates with ``DistillationTrainer``'s own methods (whose caps the
    callback sets; test_trl_callback pins those) and names its teacher server where the callback reads it."""
    from trl import DistillationTrainer

    served = server_distillation.ServerDistillationTrainer
    for name in ("_prepare_inputs", "_generate_and_score_completions", "_generate_single_turn", "_generate",
                 "_tool_call_loop"):
        assert getattr(served, name) is getattr(DistillationTrainer, name), f"{name} is overridden"
    assert "teacher_model_server_url" in server_distillation.ServerDistillationConfig.__dataclass_fields__
    init = inspect.getsource(served.__init__)
    assert "teacher_model=None" in init and "self.teacher_client = VLLMClient(base_url=args.teacher_model_server_url" \
        in init
    scoring = inspect.getsource(served._get_teacher_token_logprobs_from_server)
    assert "self.teacher_client.get_sequence_logprobs(" in scoring
