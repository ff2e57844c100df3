"""CountSketch of parameter gradients: the ``sketch`` audit's projection to ``dim`` numbers per gradient.

Math layer. Hashes are integer-only and keyed by (seed, parameter name), so every rank and process
projects with the same matrix and per-rank sketches can be summed by the controller.
"""

from __future__ import annotations

import hashlib

import torch

# One gradient: one entry per audited parameter, None where the loss does not reach it (zero).
Grads = list[torch.Tensor | None]

_MERSENNE = 2**31 - 1  # prime modulus of the sketch hashes; products of two residues fit in int64
_HASH_CHUNK = 1 << 20  # parameter elements hashed at a time (bounds the transient index tensors)


def _hash_coefficients(name: str, seed: int) -> list[int]:
    """Four residues mod 2^31-1 from (seed, parameter name): stable across processes and machines."""
    digest = hashlib.blake2b(f"{int(seed)}:{name}".encode(), digest_size=32).digest()
    coeffs = [int.from_bytes(digest[8 * i : 8 * i + 8], "little") % _MERSENNE for i in range(4)]
    coeffs[3] = coeffs[3] or 1  # keep the polynomial's degree at 3
    return coeffs


def countsketch_hashes(
    name: str,
    numel: int,
    seed: int,
    dim: int,
    start: int = 0,
    stop: int | None = None,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Bucket (long) and sign (+-1 float) of elements ``[start, stop)`` of parameter ``name``.

    One degree-3 polynomial mod ``p = 2^31 - 1`` with coefficients from (seed, name) gives a 4-wise
    independent value ``h`` per element (what CountSketch's variance bound asks of the signs; the
    buckets need only 2-wise); ``bucket = h mod dim``, ``sign`` from the parity of ``h // dim``.
    Integer arithmetic only (products of residues stay below 2^62), so CPU, CUDA and every process
    agree for the same seed and parameter name.
    """
    stop = numel if stop is None else stop
    if numel >= _MERSENNE:
        raise ValueError(f"parameter {name} has {numel} elements; the sketch hash supports < 2^31 - 1")
    if dim >= _MERSENNE // 4:
        raise ValueError(f"sketch dim {dim} too large for the hash")
    c0, c1, c2, c3 = _hash_coefficients(name, seed)
    x = torch.arange(start, stop, dtype=torch.int64, device=device)
    h = x * c3  # Horner, in place: each step keeps values < 2^62
    h.add_(c2).remainder_(_MERSENNE).mul_(x).add_(c1).remainder_(_MERSENNE).mul_(x).add_(c0).remainder_(
        _MERSENNE
    )
    bucket = h % dim
    sign = h.div_(dim, rounding_mode="floor").bitwise_and_(1).to(torch.float32).mul_(-2.0).add_(1.0)
    return bucket, sign


def countsketch(grads: Grads, names: list[str], dim: int, seed: int, out: torch.Tensor) -> None:
    """Add the CountSketch of one gradient (a list of per-parameter tensors) into ``out`` (dim,)."""
    for g, name in zip(grads, names, strict=True):
        if g is None:
            continue
        flat = g.reshape(-1)
        for start in range(0, flat.numel(), _HASH_CHUNK):
            stop = min(flat.numel(), start + _HASH_CHUNK)
            bucket, sign = countsketch_hashes(name, flat.numel(), seed, dim, start, stop, flat.device)
            out.index_add_(0, bucket, flat[start:stop].float() * sign)


class HashCache:
    """Each parameter's (bucket, sign) blocks for one (seed, dim), hashed once and reused over the rows and segments
    of an audit; blocks beyond ``max_elements`` in all are hashed on each use instead, which bounds the memory."""

    def __init__(self, seed: int, dim: int, max_elements: int = 1 << 23) -> None:
        self.seed, self.dim, self.room = int(seed), int(dim), int(max_elements)
        self._kept: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, name: str, numel: int, start: int, stop: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        hit = self._kept.get((name, start))
        if hit is not None:
            return hit
        pair = countsketch_hashes(name, numel, self.seed, self.dim, start, stop, device)
        if stop - start <= self.room:
            self.room -= stop - start
            self._kept[(name, start)] = pair
        return pair


def countsketch_rows(grads: Grads, names: list[str], hashes: HashCache, out: torch.Tensor) -> None:
    """Add each row's CountSketch into ``out`` (B, dim): ``grads`` holds per-row gradients, each (B, *shape).

    The same projection as ``countsketch`` row by row, accumulated in ``out``'s dtype."""
    for g, name in zip(grads, names, strict=True):
        if g is None:
            continue
        flat = g.reshape(g.shape[0], -1)  # (B, n)
        numel = flat.shape[1]
        for start in range(0, numel, _HASH_CHUNK):
            stop = min(numel, start + _HASH_CHUNK)
            bucket, sign = hashes.get(name, numel, start, stop, flat.device)
            out.index_add_(1, bucket, flat[:, start:stop].to(out.dtype) * sign.to(out.dtype))
