"""docs/adapters.md's TRL recipe, run verbatim on a tiny model on CPU; the documented defaults match the code."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from tiny_models import make_tiny_llama
from trl_fixtures import rows, tokenizer

from adwin.controller.schemas import RunIn
from adwin.trainer_adapters.generic import WindowClient
from adwin.trainer_adapters.hooks import ControllerWindowHooks

datasets = pytest.importorskip("datasets")
pytest.importorskip("trl")

from adwin.trainer_adapters.trl import AdwinCallback  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "adapters.md"


def _block(heading: str) -> str:
    text = DOC.read_text()
    match = re.search(r"```python\n(.*?)```", text[text.index(heading):], re.S)
    assert match is not None, f"docs/adapters.md lost the python block after {heading!r}"
    return match.group(1)


def test_the_trl_recipe_runs_verbatim_and_audits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the recipe writes to output_dir="out"
    prompts = [" ".join(f"w{(i * 7 + j) % 60}" for j in range(3 + i % 3)) for i in range(24)]
    ns = {"student": make_tiny_llama(seed=0), "teacher": make_tiny_llama(seed=1), "tokenizer": tokenizer(),
          "dataset": datasets.Dataset.from_dict({"prompt": prompts}), "max_len": 16, "candidates": [4, 8], "steps": 3}
    exec(compile(_block("## TRL `DistillationTrainer`"), str(DOC), "exec"), ns)  # noqa: S102
    trainer, callback = ns["trainer"], ns["callback"]
    assert trainer.state.global_step == 3 and sorted(callback.windows) == [0, 1, 2]
    assert callback.decisions, "the documented setup audits"
    assert [r["window/size"] for r in rows(trainer)] == [float(w) for w in callback.windows.values()]


def _default(fn: object, name: str) -> object:
    return inspect.signature(fn).parameters[name].default


def test_the_documented_defaults_are_the_codes() -> None:
    text = DOC.read_text()
    assert _default(AdwinCallback, "threshold") == 0.7 and "| `threshold` | `PolicyIn`, `AdwinCallback` | 0.7 |" in text
    for fn in (AdwinCallback, WindowClient, ControllerWindowHooks):
        assert _default(fn, "offer_finished") == "always"
        assert _default(fn, "resilient_controller") is True
    assert (_default(AdwinCallback, "probe_count"), _default(AdwinCallback, "probe_every")) == (8, 1)
    assert "| `probe_count` / `probe_every` | `AdwinCallback` | 8 / 1 |" in text
    fields = RunIn.model_fields
    assert (fields["probe_batch_size"].default, fields["offers_per_step"].default, fields["staleness_limit"].default) == (8, 4, 5)
    assert "| `RunIn` | 8, 4, 5 |" in text
    assert _default(AdwinCallback, "drain_timeout_s") == 30.0 and "| 30 s |" in text
    serve = (Path(__file__).resolve().parents[2] / "controller" / "serve.py").read_text()
    assert 'default=8470' in serve and "8470" in text and "8765" not in text
