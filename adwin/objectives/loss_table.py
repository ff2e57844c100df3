"""What each training loss needs and where it runs: the one table the config's rules, the sync step, the
loss function and the AsyncOPD learner read instead of keeping lists of loss names.

A new loss is one row here (plus its math in ``losses.py`` or ``oapl.py``); nothing else lists loss names.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

TeacherSignal = Literal["realized", "actions", "topk", "logits", "sequence"]


@dataclass(frozen=True)
class LossTraits:
    # what the loss reads from the teacher: realized-token logprobs, logprobs of cached MC actions, top-k,
    # full logits, or a sequence-level reward (OAPL)
    teacher: TeacherSignal
    # may weight tokens by the old-to-current ratio p_theta / p_behavior (loss.is_*, the PPO clip)
    behavior_weighted: bool
    # differentiates the realized tokens' own logprobs (IW-OPD position weights apply)
    sampled_token: bool
    # trained by the synchronous prefix-window trainer (scheduler: sync)
    sync: bool
    # trained by the AsyncOPD learner (scheduler: asyncopd)
    asyncopd: bool


LOSSES: dict[str, LossTraits] = {
    "reverse_kl_pg": LossTraits("realized", behavior_weighted=True, sampled_token=True, sync=True, asyncopd=True),
    "reverse_kl_mc": LossTraits("actions", behavior_weighted=True, sampled_token=False, sync=False, asyncopd=True),
    "forward_kl_topk": LossTraits("topk", behavior_weighted=False, sampled_token=False, sync=True, asyncopd=False),
    "forward_kl": LossTraits("logits", behavior_weighted=False, sampled_token=False, sync=True, asyncopd=False),
    "reverse_kl": LossTraits("logits", behavior_weighted=False, sampled_token=False, sync=True, asyncopd=False),
    "jsd": LossTraits("logits", behavior_weighted=False, sampled_token=False, sync=True, asyncopd=False),
    "k2": LossTraits("realized", behavior_weighted=False, sampled_token=True, sync=True, asyncopd=False),
    "k3": LossTraits("realized", behavior_weighted=False, sampled_token=True, sync=True, asyncopd=False),
    "oapl": LossTraits("sequence", behavior_weighted=False, sampled_token=False, sync=False, asyncopd=True),
}
LOSS_TRAIT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(LossTraits))


def losses_where(**traits: object) -> tuple[str, ...]:
    """Loss names whose traits equal every given one, in table order (``losses_where(asyncopd=True)``)."""
    unknown = set(traits) - set(LOSS_TRAIT_NAMES)
    if unknown:
        raise TypeError(f"unknown loss traits {sorted(unknown)}; known: {LOSS_TRAIT_NAMES}")
    return tuple(n for n, t in LOSSES.items() if all(getattr(t, k) == v for k, v in traits.items()))


ALL_LOSSES: tuple[str, ...] = tuple(LOSSES)
# per-token losses of ``opd_loss`` (OAPL is a sequence-level loss of its own module)
TOKEN_LOSSES: tuple[str, ...] = tuple(n for n, t in LOSSES.items() if t.teacher != "sequence")
BEHAVIOR_LOSSES: tuple[str, ...] = losses_where(behavior_weighted=True)
SAMPLED_TOKEN_LOSSES: tuple[str, ...] = losses_where(sampled_token=True)
ASYNCOPD_LOSSES: tuple[str, ...] = losses_where(asyncopd=True)
# what the AsyncOPD token learner (trainer_adapters/asyncopd/hf.py) trains; OAPL has a learner of its own
ASYNCOPD_TOKEN_LOSSES: tuple[str, ...] = tuple(n for n in ASYNCOPD_LOSSES if n in TOKEN_LOSSES)
