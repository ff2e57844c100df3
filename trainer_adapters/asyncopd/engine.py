"""The rollout worker's transformers engine: continuous batching on the model's own KV cache.

``HFRolloutEngine`` holds a worker's copy of the student (its latest synced snapshot) and one batch KV
cache for the requests in flight, laid out by the decode engine: ``adwin.decode.streaming.DynamicSlots``
(transformers' ``DynamicCache``, rows merged with left padding) or, compiled (``rollout.compile``),
``adwin.decode.slots.StaticSlots`` (the ``StaticBatch`` every compiled decoder uses). Each ``step`` costs one
batched decode forward of one token per request already in the cache, plus one prefill forward for the
requests that joined since the previous step. Newcomers wait (their step returns None) until they are at least
``admit_fraction`` of the step's requests or nothing else decodes: one prefill for several of them instead of
one per step (a prefill and a cache merge cost about a decode step each; measured 27 % more tokens per second
at 1/8 with 128 requests, and 25 % more again from keeping left rows until a merge).

Keep-mode (AsyncOPD's prefix-cache reset): ``load_weights`` drops the cache and only it does. A request
kept across a weight sync is prefilled again, its whole prefix under the new weights, at the next step; a
request whose cache is still valid is never re-encoded.

Sampling (``behavior_sample`` on the shared ``adwin.decode.sampler.TokenSampler``): each token from the
behavior distribution ``softmax(logits / T)``, top-p filtered when ``top_p < 1`` (the realized token's logprob is that filtered distribution's, like
vLLM's processed logprobs), and for the multi-sample MC estimator ``m`` actions drawn iid (with
replacement) from the same distribution with their behavior logprobs (AsyncOPD Appendix G). The draws come
from the engine's generator in the requests' order, so they do not depend on the batch layout.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from adwin.decode.sampler import TokenSampler
from adwin.decode.slots import StaticSlots
from adwin.decode.static_cache import CompileSetting, compile_wanted, lays_rows
from adwin.decode.streaming import DynamicSlots
from adwin.student.lora import load_trained_state
from adwin.trainer_adapters.asyncopd.items import StreamItem, TokenOut

log = logging.getLogger(__name__)


def behavior_sample(logits: torch.Tensor, sampler: TokenSampler, *, m: int, eos: set[int]) -> list[TokenOut]:
    """One token per row of ``logits`` (n, V) from the behavior distribution, with ``m`` MC actions each."""
    drawn = sampler.behavior(logits, m)
    tok, tok_lp = drawn.tokens.tolist(), drawn.logprobs.tolist()  # (n,)
    if drawn.actions is None or drawn.action_logprobs is None:
        return [TokenOut(t, lp, eos=t in eos) for t, lp in zip(tok, tok_lp, strict=True)]
    acts, acts_lp = drawn.actions.tolist(), drawn.action_logprobs.tolist()  # (n, m)
    return [TokenOut(t, lp, eos=t in eos, mc_actions=a, mc_logprobs=alp)
            for t, lp, a, alp in zip(tok, tok_lp, acts, acts_lp, strict=True)]


class HFRolloutEngine:
    """A rollout worker's student snapshot with a continuous-batching KV cache; see the module docstring."""

    def __init__(self, model: torch.nn.Module, *, eos: set[int], pad_id: int, temperature: float = 1.0,
                 top_p: float = 1.0, mc_samples: int = 1, seed: int = 0, admit_fraction: float = 0.125,
                 compile: CompileSetting = False, max_len: int | None = None) -> None:
        if temperature <= 0:
            raise ValueError("the MC estimator needs a sampling distribution: temperature must be > 0")
        if mc_samples < 0:
            raise ValueError(f"mc_samples must be >= 0, got {mc_samples}")
        if not 0.0 <= admit_fraction <= 1.0:
            raise ValueError(f"admit_fraction must be in [0, 1], got {admit_fraction}")
        self.model = model.eval().requires_grad_(False)
        self.eos, self.pad_id, self.temperature, self.top_p = eos, pad_id, temperature, top_p
        self.m = mc_samples  # 0: no MC cache
        self.version = 0
        self.gen = torch.Generator().manual_seed(seed)
        self.sampler = TokenSampler(temperature, top_p, generator=self.gen)  # refuses a top_p outside (0, 1]
        self.admit_fraction = admit_fraction
        self._stepped: set[str] = set()  # requests that got a token at the previous step
        self.prefilled_tokens = 0  # context tokens encoded by prefills (a kept request's rebuild included)
        self._slots: StaticSlots | None = None  # rollout.compile: the static-cache layout
        # auto: eager where the static cache cannot lay rows (sliding windows); true refuses such a model by type
        if compile_wanted(compile, next(model.parameters()).device) and (compile is True or lays_rows(model)):
            if max_len is None:
                raise ValueError("a compiled engine (rollout.compile) needs max_len: the longest request "
                                 "(data.max_prompt_len + rollout.max_response_len) sizes its static cache")
            self._slots = StaticSlots(self.model, pad_id, max_len)
        self._layout: StaticSlots | DynamicSlots = self._slots or DynamicSlots(self.model, pad_id)

    def _reset(self) -> None:
        self._layout.reset()

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> None:
        load_trained_state(self.model, weights)
        self.version = version
        self._reset()  # the prefix-cache reset: kept requests are re-encoded under the new weights

    @property
    def cached_requests(self) -> list[str]:
        return self._layout.cached_requests

    @property
    def cache_rows(self) -> int:
        """Rows in the batch cache, those of requests that left and are not dropped yet included (compiled:
        the slots, free ones included)."""
        return len(self._layout.rows)

    # ------------------------------------------------------------------------------------- the cache

    def step(self, items: Sequence[StreamItem]) -> list[TokenOut | None]:
        """One token for every item that decodes this step (None for a newcomer left waiting), sampled
        from the behavior distribution in the items' order."""
        going = [it.request_id in self._stepped for it in items]
        waiting = len(items) - sum(going)
        if waiting and (waiting >= self.admit_fraction * len(items) or not any(going)):
            going = [True] * len(items)
        advancing = [it for it, g in zip(items, going, strict=True) if g]
        self._stepped = {it.request_id for it in advancing}
        if not advancing:
            return [None] * len(items)
        outs = iter(behavior_sample(self.next_logits(advancing), self.sampler, m=self.m, eos=self.eos))
        return [next(outs) if g else None for g in going]

    @torch.no_grad()
    def next_logits(self, items: Sequence[StreamItem]) -> torch.Tensor:
        """Next-token logits (n, V) of every item, in their order, from the engine's layout: a request with one new
        token decodes it in one batched forward, newcomers (and requests the cache no longer matches) are
        prefilled (``adwin.decode.streaming.DynamicSlots``; compiled: ``adwin.decode.slots.StaticSlots``)."""
        before = self._layout.prefilled_tokens
        out = self._layout.next_logits(items)
        self.prefilled_tokens += self._layout.prefilled_tokens - before
        return out
