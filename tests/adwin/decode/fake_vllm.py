"""Stand-ins for ``vllm.LLM`` that compute with transformers models on CPU (helpers, no tests here).

``HFBackedLLM`` plays the rollout engine: its own copy of the student (as vLLM holds its own weights),
``generate`` samples each request with its ``max_tokens``, seed and stop ids, ``load_weights`` (through the
driver worker's model runner, the path ``VLLMRollout.sync_weights`` takes) copies tensors into the copy.
``PromptLogprobLLM`` plays a teacher engine: ``prompt_logprobs`` from a transformers teacher's logits.
Both record what they were asked, for the tests to check.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from adwin.decode.generate import generate


def params(**kw: Any) -> SimpleNamespace:
    """Stands in for ``vllm.SamplingParams``."""
    return SimpleNamespace(**kw)


@dataclass
class Request:
    phase: Any  # what the test says was running (set on the engine before the call)
    context_len: int
    max_tokens: int
    seed: int | None
    weights_match: bool  # the engine's weights equal the trainer's student's at this call


@dataclass
class HFBackedLLM:
    student: torch.nn.Module  # the trainer's module: every call checks the engine holds the same weights
    model: torch.nn.Module = field(init=False)
    phase: Any = None
    requests: list[Request] = field(default_factory=list)
    loads: int = 0  # tensors loaded
    resets: int = 0  # prefix-cache resets: one per weight sync

    def __post_init__(self) -> None:
        self.model = copy.deepcopy(self.student).eval()
        with torch.no_grad():  # a real engine starts from the checkpoint, not the trainer's current tensors
            for p in self.model.parameters():
                p.add_(0.01)
        runner = SimpleNamespace(model=SimpleNamespace(load_weights=self._load_weights))
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=SimpleNamespace(
            model_runner=runner)))

    def _load_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        state = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in weights:
                state[name].copy_(tensor)
                self.loads += 1

    def reset_prefix_cache(self) -> None:
        self.resets += 1

    def same_weights(self) -> bool:
        mine = self.model.state_dict()
        return all(torch.equal(mine[k], v) for k, v in self.student.state_dict().items())

    def generate(self, prompts: list[dict[str, list[int]]], sampling: list[SimpleNamespace],
                 use_tqdm: bool = False) -> list[SimpleNamespace]:
        same = self.same_weights()
        out = []
        for prompt, p in zip(prompts, sampling, strict=True):
            ctx = prompt["prompt_token_ids"]
            self.requests.append(Request(self.phase, len(ctx), p.max_tokens, p.seed, same))
            with torch.random.fork_rng():
                torch.manual_seed(p.seed if p.seed is not None else 0)
                g = generate(self.model, [ctx], [p.max_tokens], eos=set(p.stop_token_ids), pad_id=0,
                             temperature=p.temperature, top_p=p.top_p, with_logprobs=True)
            ids, lps = g.response_ids[0], g.logprobs[0]  # type: ignore[index]
            comp = SimpleNamespace(token_ids=ids, finish_reason="stop" if g.finished[0] else "length",
                                   logprobs=[{t: SimpleNamespace(logprob=lp, rank=None)} for t, lp in zip(ids, lps, strict=True)])
            out.append(SimpleNamespace(outputs=[comp], prompt_logprobs=None))
        return out


@dataclass
class PromptLogprobLLM:
    teacher: torch.nn.Module
    calls: int = 0

    def generate(self, prompts: list[dict[str, list[int]]], sampling: SimpleNamespace,
                 use_tqdm: bool = False) -> list[SimpleNamespace]:
        self.calls += 1
        out = []
        for prompt in prompts:
            seq = prompt["prompt_token_ids"]
            with torch.no_grad():
                logp = torch.log_softmax(self.teacher(input_ids=torch.tensor([seq])).logits[0].double(), -1)
            entries: list[dict[int, SimpleNamespace] | None] = [None]
            for i in range(1, len(seq)):
                row = logp[i - 1]
                top = row.topk(sampling.prompt_logprobs).indices.tolist()
                entry = {t: SimpleNamespace(logprob=float(row[t]), rank=r + 1) for r, t in enumerate(top)}
                entry.setdefault(seq[i], SimpleNamespace(logprob=float(row[seq[i]]),
                                                         rank=int((row > row[seq[i]]).sum()) + 1))
                entries.append(entry)
            out.append(SimpleNamespace(prompt_logprobs=entries, outputs=[]))
        return out
