"""Per-row sampling noise (``rollout.seeding: per_sample``): a row's tokens do not depend on its batch.

HF ``generate`` draws the sampling noise of a whole batch from one generator, so the tokens of a row
depend on which other rows share its batch and where it sits: the same prompt sampled in a shard of a
data-parallel batch gets other tokens than in the single-process batch. ``SeededSampling`` replaces
HF's sampler by the Gumbel-max trick with one generator per row: under ``do_sample=False`` (argmax) it
applies temperature and top-p like HF's warpers, then adds Gumbel noise drawn from the row's own
generator, so token ``k`` of a row uses that row's ``k``-th draw whatever the batch composition.
argmax(log p + Gumbel) is an exact sample of p (docs/decisions.md, "Per-sample seeding").

``row_seed`` names a row's stream by (run seed, purpose, step, key): the trainer keys rollouts by the
global row index of the step's batch, evaluation by the problem row, probe rounds by the probe's context
and the weights version of the round.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

PURPOSES: tuple[str, ...] = ("rollout", "probe", "eval")


def row_seed(seed: int, purpose: str, step: int, key: int | str | bytes) -> int:
    """A 63-bit generator seed for one row's stream, stable across processes and machines."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    raw = key if isinstance(key, bytes) else str(key).encode()
    digest = hashlib.blake2b(f"{int(seed)}|{purpose}|{int(step)}|".encode() + raw, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def context_key(context: Sequence[int], occurrence: int) -> bytes:
    """Key of a probe row: its context (prompt + tokens so far) and, for identical contexts in one round,
    which of them it is (in the round's order, the same in every process)."""
    return hashlib.blake2b(repr((list(map(int, context)), occurrence)).encode(), digest_size=16).digest()


def context_keys(contexts: Sequence[Sequence[int]]) -> list[bytes]:
    seen: dict[tuple[int, ...], int] = {}
    keys = []
    for c in contexts:
        t = tuple(int(x) for x in c)
        keys.append(context_key(t, seen.get(t, 0)))
        seen[t] = seen.get(t, 0) + 1
    return keys


class SeededSampling:
    """HF ``LogitsProcessor``: temperature and top-p, then Gumbel noise from each row's own generator.

    Use with ``do_sample=False``: the argmax of the returned scores is a sample of the tempered, top-p
    filtered distribution. Filtered tokens get ``-inf``. One draw of ``V`` uniforms per row per call, so a
    row's ``k``-th token always uses its ``k``-th draw (finished rows keep drawing and are padded by HF).
    """

    def __init__(self, seeds: Sequence[int], temperature: float = 1.0, top_p: float = 1.0,
                 device: torch.device | str = "cpu") -> None:
        if temperature <= 0:
            raise ValueError("SeededSampling samples; temperature 0 decodes greedily without it")
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.generators = []
        for s in seeds:
            g = torch.Generator(device=device)
            g.manual_seed(int(s))
            self.generators.append(g)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logits = scores.float() / self.temperature  # (B, V)
        if self.top_p < 1.0:  # HF's TopPLogitsWarper: drop the low tail whose mass is at most 1 - top_p
            sorted_logits, order = torch.sort(logits, descending=False)
            cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (B, V)
            drop = cum <= (1.0 - self.top_p)
            drop[..., -1:] = False  # keep at least the most likely token
            logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        if logits.shape[0] != len(self.generators):
            raise ValueError(f"{logits.shape[0]} rows but {len(self.generators)} row generators")
        u = torch.stack([torch.rand(logits.shape[1], generator=g, device=logits.device, dtype=torch.float64)
                         for g in self.generators])  # (B, V)
        gumbel = -torch.log(-torch.log(u.clamp_min(1e-300)))  # (B, V)
        return (torch.log_softmax(logits.double(), dim=-1) + gumbel).to(scores.dtype)
