"""The vLLM backend's CPU-side logic with stand-in engine outputs (vLLM itself is not imported here).

What runs on a GPU is in test_vllm_gpu.py; these check the parsing, the tensor layout fed to the losses,
the weight-sync order and the missing-install error, which need no engine.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from tiny_models import make_tiny_llama

import adwin.backends as backends
from adwin.backends import BackendUnavailable, check_backends
from adwin.cli import main
from adwin.config import load_config
from adwin.decode.vllm import VLLMRollout, parse_outputs
from adwin.objectives.losses import forward_kl, opd_loss
from adwin.teacher.vllm import VLLMTeacher, parse_prompt_logprobs, scores_to_tensors

pytestmark = pytest.mark.numerics  # parity of numbers across code paths: rerun per CPU capability


def _lp(logprob: float, rank: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(logprob=logprob, rank=rank)


def _prompt_logprobs(logits: torch.Tensor, seq: list[int], k: int) -> list[dict[int, SimpleNamespace] | None]:
    """What vLLM returns for ``prompt_logprobs=k``: per position the top-k and the realized token, ranked."""
    logp = torch.log_softmax(logits.double(), -1)  # (L, V): row i-1 predicts seq[i]
    out: list[dict[int, SimpleNamespace] | None] = [None]
    for i in range(1, len(seq)):
        row = logp[i - 1]
        order = row.argsort(descending=True).tolist()
        rank = {t: r + 1 for r, t in enumerate(order)}
        entry = {t: _lp(float(row[t]), rank[t]) for t in order[:k]}
        entry[seq[i]] = _lp(float(row[seq[i]]), rank[seq[i]])
        out.append(entry)
    return out


def test_full_vocab_topk_teacher_scores_reproduce_the_dense_forward_kl() -> None:
    torch.manual_seed(0)
    student, teacher = make_tiny_llama(seed=0), make_tiny_llama(seed=10)
    V = student.config.vocab_size
    seqs = [[1, 5, 6, 7, 9, 3], [1, 8, 4, 11]]
    n_prompt = [3, 2]
    width = max(len(s) for s in seqs)
    ids = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.bool)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
        mask[b, n_prompt[b] : len(s)] = True
    with torch.no_grad():
        t_logits = teacher(input_ids=ids).logits  # (B, L, V)
    scores = [parse_prompt_logprobs(s, n_prompt[b], _prompt_logprobs(t_logits[b, : len(s)], s, V), V)
              for b, s in enumerate(seqs)]
    realized, top_ids, top_lp = scores_to_tensors(scores, n_prompt, width, V)
    s_logits = student(input_ids=ids).logits
    loss, _ = opd_loss("forward_kl_topk", input_ids=ids, response_mask=mask, student_logits=s_logits,
                       teacher_topk_ids=top_ids, teacher_topk_logprobs=top_lp)
    dense = forward_kl(s_logits, t_logits, mask)  # (B, L)
    assert float(loss.detach()) == pytest.approx(float(dense.detach()[mask].mean()), rel=1e-4)
    t_real = torch.log_softmax(t_logits.double(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(realized[:, 1:][mask[:, 1:]].double(), t_real[mask[:, 1:]], atol=1e-5)


def test_topk_keeps_rank_order_and_leaves_an_out_of_topk_realized_token_out() -> None:
    seq = [1, 4, 9]
    plp = [None, {7: _lp(-0.1, 1), 5: _lp(-2.0, 2), 4: _lp(-5.0, 9)}, {9: _lp(-0.3, 1), 2: _lp(-1.5, 2)}]
    s = parse_prompt_logprobs(seq, 1, plp, k=2)
    assert s.realized == [-5.0, -0.3]
    assert s.topk_ids == [[7, 5], [9, 2]] and s.topk_logprobs == [[-0.1, -2.0], [-0.3, -1.5]]
    _, ids, lps = scores_to_tensors([s], [1], 4, 3)  # k=3 slots: the third is unfilled
    assert ids[0, 1].tolist() == [7, 5, 0] and lps[0, 1, 2] == float("-inf") and lps[0, 3].isinf().all()
    with pytest.raises(ValueError, match="position 2"):
        parse_prompt_logprobs(seq, 1, [None, plp[1], {2: _lp(-1.5, 1)}], k=2)


class _FakeLLM:
    """Records calls; ``generate`` answers one token per sample, ids counting up."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        model = SimpleNamespace(load_weights=lambda ws: self.calls.append(("load", [n for n, _ in ws])))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model))))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset", None))

    def generate(self, prompts, params, use_tqdm=False):
        self.calls.append(("generate", params))
        out = []
        for i, _ in enumerate(prompts):
            comps = [SimpleNamespace(token_ids=[10 * i + j], logprobs=[{10 * i + j: _lp(-0.5 - j)}],
                                     finish_reason="length") for j in range(params.n)]
            out.append(SimpleNamespace(outputs=comps, prompt_logprobs=None))
        return out


def test_rollout_caps_max_tokens_at_the_window_and_sync_loads_then_resets_the_prefix_cache() -> None:
    llm = _FakeLLM()
    ro = VLLMRollout(llm, sampling_params=lambda **kw: SimpleNamespace(**kw))
    comps = ro.generate([[1, 2], [1, 3]], 7, n=2)
    params = llm.calls[0][1]
    assert params.max_tokens == 7 and params.logprobs == 0 and params.n == 2
    assert [[c.token_ids for c in p] for p in comps] == [[[0], [1]], [[10], [11]]]
    assert comps[0][1].logprobs == [-1.5] and not comps[0][0].finished
    ro.sync_weights([("a", torch.zeros(1)), ("b", torch.ones(1))])
    assert [c[0] for c in llm.calls[1:]] == ["load", "load", "reset"]
    with pytest.raises(ValueError, match="window"):
        ro.generate([[1]], 0)


def test_asyncopd_vllm_engine_takes_realized_token_first_and_m_cached_actions() -> None:
    from adwin.trainer_adapters.asyncopd.vllm import VLLMRolloutEngine

    llm = _FakeLLM()
    eng = VLLMRolloutEngine(VLLMRollout(llm, lambda **kw: SimpleNamespace(**kw)), eos={11}, mc_samples=3)
    items = [SimpleNamespace(prompt_ids=[1], tokens=[4]), SimpleNamespace(prompt_ids=[1], tokens=[])]
    outs = eng.step(items)
    assert llm.calls[0][1].n == 4 and llm.calls[0][1].max_tokens == 1
    assert outs[0].token == 0 and outs[0].mc_actions == [1, 2, 3] and outs[0].mc_logprobs == [-1.5, -2.5, -3.5]
    assert outs[1].token == 10 and not outs[1].eos
    eng.load_weights({"w": torch.zeros(1)}, 4)
    assert eng.version == 4 and llm.calls[-1][0] == "reset"


def test_teacher_requests_prompt_logprobs_with_one_generated_token() -> None:
    seq_lp = [None, {5: _lp(-1.0, 1)}, {6: _lp(-2.0, 1)}]
    llm = SimpleNamespace(generate=lambda prompts, params, use_tqdm=False: [SimpleNamespace(prompt_logprobs=seq_lp)])
    seen = []
    teacher = VLLMTeacher(llm, topk=1, sampling_params=lambda **kw: seen.append(kw) or SimpleNamespace(**kw))
    (s,) = teacher.score([[1]], [[5, 6]])
    assert seen == [{"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 1}]
    assert s.realized == [-1.0, -2.0]


def test_parse_outputs_refuses_requests_made_without_logprobs() -> None:
    out = [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[3], logprobs=None, finish_reason="stop")])]
    with pytest.raises(ValueError, match="logprobs=0"):
        parse_outputs(out)


def test_vllm_backend_without_vllm_fails_before_compute_with_install_hint(tmp_path: Path, monkeypatch,
                                                                           capsys) -> None:
    monkeypatch.setattr(backends, "vllm_available", lambda: False)
    cfg = load_config(overrides={"rollout.backend": "vllm", "probes.backend": "inline"})
    with pytest.raises(BackendUnavailable, match=r"rollout\.backend.*adwin\[vllm\]"):
        check_backends(cfg)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"rollout": {"backend": "vllm"}, "probes": {"backend": "inline"},
                                    "out_dir": str(tmp_path / "runs"),
                                    "model": {"student": str(tmp_path / "nowhere")}}))
    assert main(["train", "--config", str(path), "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "rollout.backend" in err and "adwin[vllm]" in err
    assert not (tmp_path / "runs").exists()
    check_backends(load_config(overrides={"rollout.backend": "hf"}))  # the CPU default needs nothing
