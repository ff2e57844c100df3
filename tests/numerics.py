"""What a parity test promises, in one place: tolerances derived from the dtype and the size of the reduction.

Two runs that compute the same sums in a different order (ranks against one process, micro-batches against the
whole batch, sharded against unsharded, compiled against eager) agree only up to rounding, and the rounding of a
reduction depends on the CPU's kernels (``ATEN_CPU_CAPABILITY``: ``default`` / ``avx2`` / ``avx512``). Each parity
test therefore says which of three promises it makes (docs/reliability.md, "Numerical parity"):

- exact: the computation is the same math, so it runs in float64 and agrees to ``EXACT_F64``. Adam's
  normalisation ``m / (sqrt(v) + eps)`` turns a last-bit difference of a near-zero gradient entry into an
  update difference of up to ``lr``; in float64 that last bit is ~1e-16 of the gradient's scale and Adam's ``eps``
  (1e-8) bounds the amplification, so a few steps at lr <= 1e-2 stay far inside ``EXACT_F64``.
- within float32 rounding, before the optimizer: gradients, losses and logprobs of a float32 run, compared at
  ``f32_sum_tol(n)`` relative to the scale of the quantity, where ``n`` is the number of terms a reduction adds.
- after float32 optimizer steps, never at an element-wise tolerance tighter than the update size ``lr``: there a
  test compares the step's direction or a metric, not the last bits of a parameter.
"""

from __future__ import annotations

import math

import torch

EXACT_F64 = 1e-9
F32_EPS = float(torch.finfo(torch.float32).eps)  # 1.19e-7


def f32_sum_tol(n_terms: int, safety: float = 8.0) -> float:
    """Relative tolerance for two float32 sums of ``n_terms`` terms added in different orders.

    Reordering a sum changes it by at most ~``n * eps`` of the sum of magnitudes (the worst case); rounding errors
    of independent additions grow like ``sqrt(n) * eps`` in practice. ``safety`` times the ``sqrt`` bound covers
    blocked (SIMD-width dependent) reductions without reaching the worst case's looseness."""
    if n_terms < 1:
        raise ValueError(f"n_terms must be >= 1, got {n_terms}")
    return safety * F32_EPS * math.sqrt(n_terms)


def assert_same_params(a: torch.nn.Module, b: torch.nn.Module, tol: float = EXACT_F64) -> None:
    """Parameter by parameter; the default is the exact promise, for float64 runs."""
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        if tol > 0 and p.dtype != torch.float64 and tol < 10 * F32_EPS:
            raise ValueError(f"{name}: a {p.dtype} parameter cannot promise agreement to {tol}; run the test in "
                             "float64 (the exact promise) or compare before the optimizer")
        torch.testing.assert_close(p, q, rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}")
