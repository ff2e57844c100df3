"""Which rollouts of a step are offered to the controller as probes: one rule for every trainer.

The built-in trainer, the TRL callback, the generic ``WindowClient`` and the AsyncOPD hooks all decide
with ``offer_indices``, so an ADWIN run keeps auditing whatever the window (docs/decisions.md,
"Finished rollouts as probes").

Unfinished prefixes (cut by the window) are always offered: continuing them to the end is what a probe
is. A rollout that finished inside the window is already a complete sample of the full-rollout
gradient and costs no extension; it is offered

* at the full horizon (``window >= max_len``), whatever ``offer_finished`` says: nothing is unfinished
  there, yet the window must still be able to shrink again;
* at every window with ``offer_finished="always"``, so that a window most rollouts fit into still
  produces probe batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

OfferFinished = Literal["at_horizon", "always"]
OFFER_FINISHED: tuple[str, ...] = ("at_horizon", "always")


def offer_indices(finished: Sequence[bool], window: int, max_len: int,
                  offer_finished: str = "at_horizon") -> list[int]:
    """Indices of the rollouts to offer; ``finished[b]``: rollout ``b`` ended (EOS) inside the window."""
    if offer_finished not in OFFER_FINISHED:
        raise ValueError(f"offer_finished must be one of {OFFER_FINISHED}, got {offer_finished!r}")
    offer_all = offer_finished == "always" or window >= max_len
    return [b for b, done in enumerate(finished) if offer_all or not done]


def is_complete(finished: bool, response_len: int, max_len: int) -> bool:
    """An offered rollout needs no extension when it ended or already reached the horizon."""
    return finished or response_len >= max_len
