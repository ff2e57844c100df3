"""vLLM backend on a real engine: needs CUDA and ``adwin[vllm]``; skipped (with the reason) otherwise.

Never run while writing them (no GPU was available): expect to adjust the tiny model's shape to what
the installed vLLM's attention backend accepts (head_dim 64 here).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import make_tiny_llama

from adwin.backends import vllm_available
from adwin.backends.logprob_gap import ragged_gap

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM backend tests need a CUDA GPU; none is visible"),
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed: pip install 'adwin[vllm]'"),
    pytest.mark.timeout(600),
]


def _save(tmp: Path, seed: int) -> tuple[str, torch.nn.Module]:
    model = make_tiny_llama(vocab_size=128, hidden_size=128, num_heads=2, intermediate_size=256, seed=seed)
    path = tmp / f"m{seed}"
    model.save_pretrained(path)
    return str(path), model


def _hf_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[float]:
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
    return [float(logp[len(prompt) + j - 1, t]) for j, t in enumerate(tokens)]


def test_rollout_respects_the_window_and_weight_sync_changes_the_sampler(tmp_path: Path) -> None:
    from adwin.decode.vllm import VLLMRollout

    path, model = _save(tmp_path, 0)
    ro = VLLMRollout.load(path, dtype="float32", gpu_memory_utilization=0.2, max_model_len=128)
    prompts = [[1, 5, 6], [1, 7]]
    comps = ro.generate(prompts, 5, n=2)
    assert all(len(c.token_ids) <= 5 for per in comps for c in per)
    gap = ragged_gap([_hf_logprobs(model, p, c.token_ids) for p, per in zip(prompts, comps, strict=True) for c in per],
                     [c.logprobs for per in comps for c in per])
    assert gap["rollout/logprob_gap_p99"] < 1e-2, gap
    _, other = _save(tmp_path, 7)
    ro.sync_weights(other.state_dict().items())
    comps = ro.generate(prompts, 5)
    gap = ragged_gap([_hf_logprobs(other, p, per[0].token_ids) for p, per in zip(prompts, comps, strict=True)],
                     [per[0].logprobs for per in comps])
    assert gap["rollout/logprob_gap_p99"] < 1e-2, "the engine samples from the synced weights"


def test_teacher_prompt_logprobs_match_the_hf_teacher(tmp_path: Path) -> None:
    from adwin.teacher.vllm import VLLMTeacher

    path, model = _save(tmp_path, 3)
    teacher = VLLMTeacher.load(path, topk=5, dtype="float32", gpu_memory_utilization=0.2, max_model_len=128)
    prompt, resp = [1, 5, 6], [9, 10, 11, 2]
    (s,) = teacher.score([prompt], [resp])
    assert s.realized == pytest.approx(_hf_logprobs(model, prompt, resp), abs=1e-3)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + resp])).logits[0].double(), -1)
    for j in range(len(resp)):
        assert s.topk_ids[j] == logp[len(prompt) + j - 1].topk(5).indices.tolist()
