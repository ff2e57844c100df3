"""verl's real agent loop and server-client classes on a local generator: a tiny Llama behind verl's
``LLMServerClient`` interface (no Ray, no vLLM), a code-built tokenizer and verl's own config objects."""

from __future__ import annotations

import asyncio
from typing import Any

import torch
from omegaconf import OmegaConf
from tiny_models import make_tiny_llama
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

PAD, BOS, EOS = 0, 1, 2
PROMPT_LEN, RESPONSE_LEN = 8, 16


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "<bos>", "<eos>", "<unk>"] + [f"w{i}" for i in range(60)]  # ids match make_tiny_llama
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>")
    out.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"  # the prompt's words as is
    return out


def trainer_config(response_length: int = RESPONSE_LEN, trainer: dict[str, Any] | None = None) -> Any:
    """The parts of verl's trainer config an agent loop and ``LLMServerClient`` read, at the settings adwin runs
    under (``trainer``: other ``trainer.*`` values)."""
    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": PROMPT_LEN, "response_length": response_length,
                                          "name": "vllm", "full_determinism": False, "temperature": 1.0,
                                          "agent": {"default_agent_loop": "adwin"}},
                              "actor": {"strategy": "fsdp2"}},
        "data": {"apply_chat_template_kwargs": {}},
        "distillation": {"enabled": True},
        "trainer": {"use_v1": False} | (trainer or {}),
    })


class LocalReplica:
    """A rollout replica in this process: ``generate.remote(...)`` is awaitable, as a Ray actor method is.

    It samples with a tiny Llama and never emits EOS, so every request runs to its ``max_tokens``; ``seen`` records
    each request's sampling parameters."""

    def __init__(self, seed: int = 0) -> None:
        self.model = make_tiny_llama(seed=seed)
        self.seen: list[dict[str, Any]] = []
        self.generate = self  # handle.generate.remote(**kwargs)

    def remote(self, *, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
               **kwargs: Any) -> Any:
        self.seen.append(dict(sampling_params))
        return self._run(prompt_ids, int(sampling_params.get("max_tokens", RESPONSE_LEN)))

    async def _run(self, prompt_ids: list[int], max_tokens: int) -> TokenOutput:
        await asyncio.sleep(0)
        with torch.no_grad():
            out = self.model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_tokens, do_sample=True,
                                      suppress_tokens=[EOS, PAD], pad_token_id=PAD, min_new_tokens=max_tokens)
        return TokenOutput(token_ids=out[0, len(prompt_ids):].tolist(), stop_reason="completed")


class LocalServerClient(LLMServerClient):
    """verl's ``LLMServerClient`` with its load balancer replaced by one local replica: ``generate`` is verl's."""

    def __init__(self, config: Any, replica: LocalReplica) -> None:
        super().__init__(config, load_balancer_handle=None)
        self.replica = replica

    async def _acquire_server(self, request_id: str, **extra: Any) -> tuple[str, Any]:
        return "local", self.replica

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        return None


def agent_loop(cls: type, replica: LocalReplica, response_length: int = RESPONSE_LEN,
               trainer: dict[str, Any] | None = None) -> Any:
    """An agent loop of ``cls`` built with the arguments verl's ``AgentLoopWorker`` passes."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    config = trainer_config(response_length, trainer)
    return cls(trainer_config=DictConfigWrap(config), server_manager=LocalServerClient(config, replica),
               tokenizer=tokenizer(), processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data))
