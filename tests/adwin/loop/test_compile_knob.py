"""``rollout.compile`` reaches every decoder of the student: the rollout engine, compact evaluation, the probe
workers' extenders (inline, thread, Ray), the generic adapter's extender and the AsyncOPD engines. Each test
records what a decoder was called or built with (the compiled paths themselves: tests/adwin/decode/
test_static_cache.py, tests/trainer_adapters/test_asyncopd_engine.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tiny_models import make_tiny_llama

import adwin.decode.engine as engine_mod
import adwin.probes.executors as executors_mod
import adwin.sampling.batch as batch_mod
import adwin.trainer_adapters.generic as generic_mod
from adwin.config import load_config
from adwin.decode.loop import Generation
from adwin.loop.evaluate import evaluate
from adwin.loop.sampler import Sampler
from adwin.probes.executors import build_executor
from adwin.probes.extender import ModelExtender
from adwin.probes.pool import ProbePool
from adwin.sampling.data import Prompt
from adwin.tasks.tokenizer import build_tokenizer
from adwin.trainer_adapters.generic import hf_extender

SETTINGS = ["auto", True, False]


class _Stop(Exception):
    """Raised by a recording decoder once it saw its arguments."""


def _sampler(setting: object) -> Sampler:
    cfg = load_config(None, {"data.max_prompt_len": 16, "rollout.compile": setting})
    tok = build_tokenizer()
    parts = SimpleNamespace(student=make_tiny_llama(vocab_size=max(64, len(tok))), tokenizer=tok,
                            eval_prompts=[Prompt("a", "1+2=", "3")])
    return Sampler(parts, cfg)  # type: ignore[arg-type]


def _recording(seen: list[Any]):
    def decoder(*args: Any, compile: Any = None, **kwargs: Any) -> Generation:
        seen.append(compile)
        raise _Stop

    return decoder


@pytest.mark.parametrize("setting", SETTINGS)
def test_the_rollout_engine_decodes_with_the_setting(setting, monkeypatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(engine_mod, "generate", _recording(seen))
    with pytest.raises(_Stop):
        _sampler(setting).roll_out([Prompt("a", "1+2=")], 1, 4)
    assert seen == [setting]


@pytest.mark.parametrize("setting", SETTINGS)
def test_compact_evaluation_decodes_with_the_setting(setting, monkeypatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(batch_mod, "generate_compacting", _recording(seen))
    gen = _sampler(setting)
    with pytest.raises(_Stop):
        evaluate(gen.parts, gen.cfg, gen)
    assert seen == [setting]


@pytest.mark.parametrize("backend", ["inline", "thread"])
def test_probe_workers_extend_with_the_setting(backend: str, monkeypatch) -> None:
    built: list[ModelExtender] = []

    def recorded(*args: Any) -> ModelExtender:
        built.append(ModelExtender(*args))
        return built[-1]

    monkeypatch.setattr(executors_mod, "ModelExtender", recorded)
    ex = build_executor(backend, ProbePool(8), make_tiny_llama(), eos={2}, pad_id=0, compile=True)
    try:
        assert built and all(e.compile is True for e in built)
    finally:
        ex.close()


def test_the_generic_adapter_s_extender_decodes_with_the_setting(monkeypatch) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(generic_mod, "generate", _recording(seen))
    with pytest.raises(_Stop):
        hf_extender(make_tiny_llama(), pad_id=0, eos_ids=[2], compile=True)([[1, 5]], [3])
    with pytest.raises(_Stop):
        hf_extender(make_tiny_llama(), pad_id=0, eos_ids=[2])([[1, 5]], [3])
    assert seen == [True, "auto"]


@pytest.mark.parametrize("setting", SETTINGS)
def test_asyncopd_engines_are_built_with_the_setting_and_the_longest_request(setting, tmp_path: Path) -> None:
    from adwin.controller import Controller
    from adwin.trainer_adapters.asyncopd.engine import HFRolloutEngine
    from adwin.trainer_adapters.asyncopd.run import build_asyncopd

    kwargs: list[dict[str, Any]] = []

    class Recorded(HFRolloutEngine):
        def __init__(self, model: Any, **kw: Any) -> None:
            kwargs.append(kw)
            super().__init__(model, **kw)

    cfg = load_config(None, {"scheduler": "asyncopd", "loss.name": "reverse_kl_mc", "rollout.compile": setting,
                             "out_dir": str(tmp_path), "controller.serve": False, "data.max_prompt_len": 8,
                             "rollout.max_response_len": 12, "window.policy": "full",
                             "window.candidates": [4, 8]})
    tok = build_tokenizer()
    student = make_tiny_llama(vocab_size=max(64, len(tok)))
    parts = SimpleNamespace(student=student, tokenizer=tok, teachers=None, train_prompts=None, eval_prompts=[],
                            checker=None)
    built = build_asyncopd(cfg, Controller(), parts=parts, engine_cls=Recorded)  # type: ignore[arg-type]
    assert kwargs and all(k["compile"] == setting and k["max_len"] == 20 for k in kwargs)
    assert all((e._slots is not None) == (setting is True) for e in built.engines)  # auto: off on CPU
