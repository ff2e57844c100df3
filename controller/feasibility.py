"""Can a run's probes ever form an audit batch? One pure rule for the controller and every adapter.

An audited run (``policies.registry.is_audited``) decides its window only from batches of ``P`` complete
probes. Two specs make that impossible, and the run would silently train on a fixed window:

* **Too few probes alive.** A probe offered at step ``t`` expires once the run passes ``t + S``
  (``staleness_limit``), so at most ``offers_per_step * (S + 1)`` probes are ever alive together. An
  adapter that sees only ``rollouts_per_step`` rollouts a step cannot offer more than those. ``P`` above
  that bound never fills. (``max_active_probes`` bounds only the probes still being extended: complete
  probes free their slot, so it slows a batch but never makes one impossible.)
* **No candidate below the horizon.** A window equal to ``max_len`` truncates nothing: with every
  candidate ``>= max_len`` the audit has no shorter window to choose.

``infeasibility`` returns the reason, naming the fields and the largest workable value, or None. The
controller refuses such a run at registration (422); the adapters call it before training.

``expiry_warning`` is the run-time counterpart: when more than ``EXPIRY_WARN_FRACTION`` of the accepted
probes expire, the batch fills too slowly for the staleness limit (the fix: a smaller ``P``, more offers
per step or a larger ``S``).
"""

from __future__ import annotations

from collections.abc import Sequence

EXPIRY_WARN_FRACTION = 0.1
EXPIRY_MIN_ACCEPTED = 8  # below this a couple of expired probes say nothing about the spec


def max_alive_probes(offers_per_step: int, staleness_limit: int, rollouts_per_step: int | None = None) -> int:
    """The most probes that can be alive (offered, not yet expired) at one time."""
    per_step = offers_per_step if rollouts_per_step is None else min(offers_per_step, rollouts_per_step)
    return per_step * (staleness_limit + 1)


def infeasibility(*, audited: bool, candidates: Sequence[int], max_len: int, probe_batch_size: int,
                  offers_per_step: int, staleness_limit: int, rollouts_per_step: int | None = None) -> str | None:
    """Why an audited run could never form a probe batch, or None when it can (always None unaudited)."""
    if not audited:
        return None
    problems = []
    if not any(c < max_len for c in candidates):
        problems.append(f"no policy.candidates entry is below policy.max_len={max_len} (got {list(candidates)}): "
                        f"add a candidate of at most {max_len - 1}, or raise policy.max_len")
    alive = max_alive_probes(offers_per_step, staleness_limit, rollouts_per_step)
    if probe_batch_size > alive:
        by = [f"offers_per_step={offers_per_step}", f"staleness_limit={staleness_limit}"]
        if rollouts_per_step is not None:
            by.append(f"rollouts_per_step={rollouts_per_step}")
        fix = f"set probe_batch_size <= {alive}" if alive > 0 else "set offers_per_step >= 1"
        problems.append(f"probe_batch_size={probe_batch_size} can never fill: at most {alive} probes are alive at once "
                        f"({', '.join(by)}); {fix}, or raise offers_per_step or staleness_limit")
    return "; ".join(problems) or None


def spec_infeasibility(spec: dict, *, audited: bool, rollouts_per_step: int | None = None) -> str | None:
    """``infeasibility`` of a registered run's spec (``RunIn.model_dump()`` / ``RunOut.spec``)."""
    policy = spec["policy"]
    return infeasibility(
        audited=audited, candidates=[int(c) for c in policy.get("candidates") or []], max_len=int(policy["max_len"]),
        probe_batch_size=int(spec["probe_batch_size"]), offers_per_step=int(spec["offers_per_step"]),
        staleness_limit=int(spec["staleness_limit"]), rollouts_per_step=rollouts_per_step,
    )


def expiry_warning(expired: int, accepted: int, *, probe_batch_size: int, staleness_limit: int) -> str | None:
    """A warning when too many accepted probes expire before an audit batch takes them, else None."""
    if accepted < EXPIRY_MIN_ACCEPTED or expired <= EXPIRY_WARN_FRACTION * accepted:
        return None
    return (f"{expired} of {accepted} accepted probes expired before an audit batch took them: a batch of "
            f"probe_batch_size={probe_batch_size} does not fill within staleness_limit={staleness_limit} steps; "
            "lower probe_batch_size, offer more probes per step (offers_per_step / probe_count, offer_finished="
            "'always') or raise staleness_limit")
