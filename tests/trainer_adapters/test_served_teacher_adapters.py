"""A teacher server behind the other loops: the AsyncOPD teacher stage (realized tokens over HTTP) and the generic
adapter's ``served_scorer`` (the same scores as ``teacher_scorer``)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch
from teacher_servers import in_thread
from trainer_fixtures import save_tiny, tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.tasks.tokenizer import build_tokenizer
from adwin.teacher.checkpoints import load_model
from adwin.trainer_adapters.asyncopd.run import run_asyncopd
from adwin.trainer_adapters.generic import served_scorer, teacher_scorer

pytestmark = pytest.mark.timeout(300)


def test_the_asyncopd_teacher_stage_scores_with_the_server(tmp_path: Path) -> None:
    ov = tiny_overrides(tmp_path, **{"scheduler": "asyncopd", "loss.name": "reverse_kl_pg", "steps": 3,
                                     "model.teacher_backend": "server"})
    with in_thread(ov["model.teachers"]["default"]) as url:  # type: ignore[index]
        out = run_asyncopd(load_config(None, ov | {"model.teachers": {"default": url}}), Controller())
        scored = httpx.get(url.removesuffix("/v1") + "/healthz").json()["rows"]
    assert len(out["logged"]) == 3 and all("loss/total" in row for row in out["logged"])
    assert scored > 3 * 4  # every trained rollout (and the probes, the evaluation) was scored over HTTP


def test_served_scorer_gives_teacher_scorers_scores(tmp_path: Path) -> None:
    path = save_tiny(tmp_path / "teacher", seed=10)
    ids = torch.randint(3, 50, (4, 10))  # (B, L)
    attn = (torch.arange(10)[None] < torch.tensor([10, 7, 4, 2])[:, None]).long()  # (B, L) right-padded
    local = teacher_scorer(load_model(path))(ids, attn)
    with in_thread(path) as url:
        served = served_scorer(url, build_tokenizer(), 64)(ids, attn)
    m = attn.bool()
    m[:, 0] = False
    assert (local - served)[m].abs().max() <= 1e-5
