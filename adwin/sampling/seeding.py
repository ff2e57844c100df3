"""Per-row sampling seeds (``rollout.seeding: per_sample``): a row's tokens do not depend on its batch.

Drawing a whole batch's noise from one generator makes a row's tokens depend on which other rows share
its batch and where it sits: the same prompt sampled in a shard of a data-parallel batch gets other tokens
than in the single-process batch. Each row gets its own seed instead, and the shared sampler
(``adwin.decode.sampler.TokenSampler``, Gumbel-max with one generator per row) draws token ``k`` of a row
from that row's ``k``-th draw whatever the batch composition (docs/decisions.md, "Per-sample seeding").

``row_seed`` names a row's stream by (run seed, purpose, step, key): the trainer keys rollouts by the
global row index of the step's batch, evaluation by the problem row, probe rounds by the probe's context
and the weights version of the round.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

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
