"""The one token sampler of the student's decoders: temperature, top-p, and where the noise comes from.

Every decoder (``adwin.decode.generate.generate``, the compacting evaluator, the AsyncOPD engine) turns
next-token logits into tokens here, so they agree on the distribution and on the draws:

- **warp**: ``logits / T`` in float32, then transformers' ``TopPLogitsWarper`` rule (drop the low tail whose mass
  is at most ``1 - top_p``, keep the most likely token); filtered tokens get ``-inf``. ``T <= 0``: greedy.
- **per-row seeds** (``rollout.seeding: per_sample``): the Gumbel-max trick with one generator per row, so token
  ``k`` of a row uses that row's ``k``-th draw of ``V`` uniforms whatever the batch composition (a data-parallel
  shard gets the single-process tokens). argmax(log p + Gumbel) is an exact sample of p (docs/decisions.md,
  "Per-sample seeding").
- **one generator, or torch's global RNG**: ``torch.multinomial`` over the batch's rows in order, as transformers'
  ``generate`` draws (global RNG) and as the AsyncOPD engine draws from its own generator. Under transformers'
  ``generate`` the sampler runs as a logits processor with ``do_sample=False`` (``logits_processor``).
- **behavior**: the same multinomial draw plus the realized token's logprob under the warped distribution and
  ``m`` iid actions with theirs (AsyncOPD's MC estimator, Appendix G).

The arithmetic of each path is the one its decoder had before the sampler was shared (pinned by
tests/adwin/decode/test_decode_parity.py; docs/decisions.md, "One decode engine").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


class SamplingError(ValueError):
    """A sampler asked for something it cannot do (no distribution, seeds that do not match the rows)."""


@dataclass
class Behavior:
    """One token per row with its behavior logprob, and ``m`` MC actions per row with theirs."""

    tokens: torch.Tensor  # (n,) long
    logprobs: torch.Tensor  # (n,) float32
    actions: torch.Tensor | None = None  # (n, m) long; None when m == 0
    action_logprobs: torch.Tensor | None = None  # (n, m) float32


class TokenSampler:
    """Tokens from next-token logits (b, V); see the module docstring.

    ``row_seeds``: one seed per row of the batch (per-row Gumbel noise); ``generator``: the multinomial's noise
    (None: torch's global RNG). ``temperature <= 0`` decodes greedily (no noise at all).
    """

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0, *, row_seeds: Sequence[int] | None = None,
                 generator: torch.Generator | None = None, device: torch.device | str = "cpu") -> None:
        if not 0.0 < top_p <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1], got {top_p}")
        if row_seeds is not None and generator is not None:
            raise SamplingError("give row_seeds (per-row noise) or a generator (one stream), not both")
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.generator = generator
        self.generators: list[torch.Generator] | None = None
        if row_seeds is not None and self.temperature > 0:
            self.generators = []
            for s in row_seeds:
                g = torch.Generator(device=device)
                g.manual_seed(int(s))
                self.generators.append(g)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        """Tempered, top-p filtered logits (b, V) float32; filtered tokens ``-inf``."""
        if self.greedy:
            raise SamplingError("a greedy sampler has no distribution to warp (temperature <= 0)")
        scaled = logits.float() / self.temperature  # (b, V)
        if self.top_p >= 1.0:
            return scaled
        sorted_logits, order = torch.sort(scaled, descending=False)  # (b, V)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (b, V)
        drop = cum <= (1.0 - self.top_p)
        drop[..., -1:] = False  # keep at least the most likely token
        return scaled.masked_fill(drop.scatter(1, order, drop), float("-inf"))

    def gumbel_scores(self, logits: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """log p + Gumbel noise (b, V) in ``logits``' dtype, row ``i`` drawing from the generator of seed
        ``rows[i]`` (all rows in order when None); its argmax is a sample of the warped distribution."""
        if self.generators is None:
            raise SamplingError("gumbel_scores needs row_seeds")
        gens = self.generators if rows is None else [self.generators[i] for i in rows.tolist()]
        if logits.shape[0] != len(gens):
            raise SamplingError(f"{logits.shape[0]} rows but {len(gens)} row generators")
        warped = self.warp(logits)  # (b, V)
        u = torch.stack([torch.rand(warped.shape[1], generator=g, device=warped.device, dtype=torch.float64)
                         for g in gens])  # (b, V)
        gumbel = -torch.log(-torch.log(u.clamp_min(1e-300)))  # (b, V)
        return (torch.log_softmax(warped.double(), dim=-1) + gumbel).to(logits.dtype)

    def __call__(self, logits: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """One token per row of ``logits`` (b, V) -> (b,). ``rows`` (b,): the seed index of each row (per-row
        seeds only; a decoder that drops stopped rows passes the survivors' original rows)."""
        if self.greedy:
            return logits.argmax(dim=-1)
        if self.generators is not None:
            return self.gumbel_scores(logits, rows).argmax(dim=-1)
        probs = torch.softmax(self.warp(logits), dim=-1)  # (b, V)
        return torch.multinomial(probs, num_samples=1, generator=self.generator).squeeze(1)

    def logits_processor(self) -> _Processor:
        """This sampler as a transformers logits processor (use with ``do_sample=False``: the argmax of its
        scores is the sampler's token)."""
        return _Processor(self)

    def behavior(self, logits: torch.Tensor, m: int) -> Behavior:
        """Tokens of ``logits`` (n, V) from the warped distribution with their logprobs, and ``m`` iid actions.

        Draws on the generator's device (the engine's generator is a CPU one), tokens first, then the actions.
        """
        if self.greedy or self.generators is not None:
            raise SamplingError("behavior sampling draws from one generator at a temperature > 0")
        device = self.generator.device if self.generator is not None else logits.device
        logp = torch.log_softmax(self.warp(logits.to(device)), dim=-1)  # (n, V)
        probs = logp.exp()  # the logprobs' own distribution: a token's logprob is exactly what it was drawn from
        tok = torch.multinomial(probs, 1, generator=self.generator)  # (n, 1)
        out = Behavior(tok.squeeze(1), logp.gather(-1, tok).squeeze(-1))
        if m > 0:
            out.actions = torch.multinomial(probs, m, replacement=True, generator=self.generator)  # (n, m)
            out.action_logprobs = logp.gather(-1, out.actions)  # (n, m)
        return out


class _Processor:
    """transformers' logits-processor call signature around a ``TokenSampler``: per-row seeds return the Gumbel
    scores themselves; a multinomial draw returns 0 at the drawn token and ``-inf`` elsewhere."""

    def __init__(self, sampler: TokenSampler) -> None:
        self.sampler = sampler

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.sampler.generators is not None:
            return self.sampler.gumbel_scores(scores)
        tokens = self.sampler(scores)  # (B,)
        return torch.full_like(scores, float("-inf")).scatter_(1, tokens[:, None], 0.0)
