"""TRL's ``ServerDistillationTrainer``, configured as TRL's docs show (``teacher_model_server_url`` = the server's
root), trains a tiny student against ``adwin teacher serve`` on 127.0.0.1, on CPU: docs/teacher-server.md's block
run verbatim (but for the URL) and TRL's default loss. Every rollout is scored by the server, the loss is finite
and the student moves."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from teacher_servers import start, stop
from tiny_models import make_tiny_llama
from trl_fixtures import MAX_LEN, make_server_trainer, prompts, rows, save_teacher, tokenizer

datasets = pytest.importorskip("datasets")
server_distillation = pytest.importorskip("trl.experimental.server_distillation")

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("trl_vllm_client")]

STEPS, BATCH = 3, 4


@pytest.fixture(scope="module")
def teacher_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``adwin teacher serve`` of a tiny teacher that shares the student's tokenizer; its root URL."""
    proc, url = start(save_teacher(tmp_path_factory.mktemp("teacher")), "--served-model-name", "tiny-teacher")
    yield url
    stop(proc)


DOC = Path(__file__).resolve().parents[2] / "docs" / "teacher-server.md"


def _doc_block() -> str:
    text = DOC.read_text()
    match = re.search(r"```python\n(.*?)```", text[text.index("## TRL's server distillation"):], re.S)
    assert match is not None, "docs/teacher-server.md lost the python block of its TRL section"
    return match.group(1)


def _check_trained(trainer: Any, before: list[torch.Tensor], url: str, rows_before: int, rollouts: int) -> None:
    assert trainer.state.global_step == STEPS
    losses = [r["loss"] for r in rows(trainer)] + [trainer.state.log_history[-1]["train_loss"]]
    assert all(math.isfinite(v) for v in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    assert httpx.get(f"{url}/healthz").json()["rows"] - rows_before == rollouts  # every rollout, once


def test_the_documented_recipe_trains_against_adwin_teacher_serve(teacher_url: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the block writes to output_dir="out"
    block = _doc_block()
    assert "http://127.0.0.1:8480" in block
    student = make_tiny_llama(seed=0)
    before = [p.detach().clone() for p in student.parameters()]
    rows_before = httpx.get(f"{teacher_url}/healthz").json()["rows"]
    ns = {"student": student, "tokenizer": tokenizer(), "dataset": prompts(STEPS * BATCH), "max_len": MAX_LEN, "steps": STEPS}
    exec(compile(block.replace("http://127.0.0.1:8480", teacher_url), str(DOC), "exec"), ns)  # noqa: S102
    trainer = ns["trainer"]
    assert trainer.loss_top_k == 4 and trainer.beta == 0.0
    batch = trainer.args.per_device_train_batch_size
    _check_trained(trainer, before, teacher_url, rows_before, STEPS * batch)


def test_trls_default_top1_reverse_kl_trains_against_adwin_teacher_serve(teacher_url: str, tmp_path: Path) -> None:
    trainer = make_server_trainer(tmp_path, teacher_url, STEPS, batch=BATCH)
    assert (trainer.args.beta, trainer.args.loss_top_k) == (1.0, 1)  # TRL's defaults
    before = [p.detach().clone() for p in trainer.model.parameters()]
    rows_before = httpx.get(f"{teacher_url}/healthz").json()["rows"]
    trainer.train()
    _check_trained(trainer, before, teacher_url, rows_before, STEPS * BATCH)
