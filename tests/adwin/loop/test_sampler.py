"""The ``Sampler`` on its ``RolloutEngine``: the transformers engine reproduces the direct ``generate`` calls
the trainer made before the engine existed (same seed, same tokens, same logprobs), and every sampling
path (rollouts, evaluation, probe extension) goes through the one engine, synced before first use."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.config import load_config
from adwin.decode.engine import HFEngine
from adwin.decode.generate import generate
from adwin.decode.loop import Generation
from adwin.loop.distributed import LocalDist
from adwin.loop.probe_rounds import RoundExtender
from adwin.loop.sampler import Sampler
from adwin.probes.extender import ModelExtender
from adwin.sampling.data import Prompt
from adwin.sampling.rollout import encode_prompts
from adwin.tasks.tokenizer import build_tokenizer

PROMPTS = [Prompt("a", "1+2="), Prompt("b", "3+4=")]


def _sampler(cfg_overrides: dict | None = None, engine: object = None) -> Sampler:
    cfg = load_config(None, {"data.max_prompt_len": 16, "rollout.temperature": 0.9, "rollout.top_p": 0.95,
                             **(cfg_overrides or {})})
    tok = build_tokenizer()
    parts = SimpleNamespace(student=make_tiny_llama(vocab_size=max(64, len(tok)), seed=4), tokenizer=tok)
    return Sampler(parts, cfg, engine)  # type: ignore[arg-type]


def test_hf_engine_rollouts_are_the_direct_generate_call_token_for_token() -> None:
    gen = _sampler({"loss.is_method": "clip"})
    assert isinstance(gen.engine, HFEngine)
    torch.manual_seed(3)
    batch = gen.roll_out(PROMPTS, 2, 6)
    ctx = encode_prompts(gen.parts.tokenizer, [p.prompt for p in PROMPTS for _ in range(2)], 16)
    torch.manual_seed(3)
    direct = generate(gen.parts.student, ctx, [6] * 4, eos=gen.eos, pad_id=gen.pad, temperature=0.9, top_p=0.95,
                      with_logprobs=True)
    assert batch.response_ids == direct.response_ids and batch.finished == direct.finished
    assert batch.behavior_logprobs == direct.logprobs


def test_hf_engine_probe_extension_is_the_model_extender_the_inline_backend_ran() -> None:
    gen = _sampler()
    ctx = [[1, 5, 6, 7], [1, 8, 9]]
    torch.manual_seed(5)
    got = RoundExtender(gen.generate, 0.9, 0.95, LocalDist(), seed=None)(ctx, [5, 3])
    torch.manual_seed(5)
    want = ModelExtender(gen.parts.student, gen.eos, gen.pad, 0.9, 0.95)(ctx, [5, 3])
    assert got == want


class _Recorder:
    """An engine that answers one token per request and records calls and syncs."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], float, bool]] = []
        self.syncs: list[int] = []

    def generate(self, contexts, budgets, *, temperature, top_p, with_logprobs, row_seeds=None):  # type: ignore[no-untyped-def]
        self.calls.append((list(budgets), temperature, with_logprobs))
        return Generation([[7] for _ in contexts], [False] * len(contexts), [[-1.0] for _ in contexts])

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        self.syncs.append(version)


def test_rollouts_evaluation_and_probes_share_the_engine_which_is_synced_before_first_use() -> None:
    eng = _Recorder()
    gen = _sampler({"eval.temperature": 0.0}, eng)
    assert eng.syncs == []  # nothing pushed until the engine is used (--resume loads weights after this)
    gen.roll_out(PROMPTS, 2, 6)
    assert eng.syncs == [0]
    gen.sync_weights(1)
    gen.roll_out(PROMPTS, 1, 16, evaluation=True)
    ext = RoundExtender(gen.generate, 0.9, 0.95, LocalDist(), seed=None)([[1, 2, 3]], [4])  # the inline extender
    assert eng.syncs == [0, 1]
    assert eng.calls == [([6] * 4, 0.9, False), ([16] * 2, 0.0, False), ([4], 0.9, True)]
    assert ext.tokens == [[7]] and ext.logprobs == [[-1.0]]


def test_hf_engine_refuses_to_sync_from_another_module() -> None:
    gen = _sampler()
    with pytest.raises(ValueError, match="own student"):
        gen.engine.sync_weights(make_tiny_llama(seed=1), 1)
