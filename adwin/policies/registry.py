"""Every window policy by name: the one list the config, the controller's schema, the CLI shorthand and the
trainer read. A new policy is a class implementing ``WindowPolicy`` (adwin/policies/base.py) plus one entry
in ``POLICIES``; nothing else compares policy names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from adwin.policies.adaptive import AdaptiveWindow
from adwin.policies.base import PolicyFields, WindowConfigError, WindowPolicy
from adwin.policies.schedules import FixedWindow, FullRollout, LinearWindow
from adwin.policies.surprise import SurpriseWindow

POLICIES: dict[str, type[WindowPolicy]] = {
    cls.name: cls for cls in (AdaptiveWindow, FullRollout, FixedWindow, LinearWindow, SurpriseWindow)
}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)
PolicyName = Literal[POLICY_NAMES]  # type: ignore[valid-type]  # pydantic reads the names from here


def policy_class(name: str) -> type[WindowPolicy]:
    try:
        return POLICIES[name]
    except KeyError:
        raise WindowConfigError(f"policy name must be one of {', '.join(POLICY_NAMES)}; got {name!r}") from None


def is_audited(name: str) -> bool:
    """Whether the policy decides from probe audits (so a run must offer probes and audit them)."""
    return policy_class(name).audited


def trains_whole_response(name: str) -> bool:
    """Whether the policy's window is always the whole response (the horizon), whatever the audits say."""
    return issubclass(policy_class(name), FullRollout)


def spec_usage() -> str:
    return ", ".join(":".join([n, *(a.upper() for a in c.spec_args)]) for n, c in POLICIES.items())


def parse_policy_spec(spec: str) -> dict[str, Any]:
    """Parse the CLI shorthand (``adwin``, ``fixed:W``, ``linear:START:STEP``, ...) into policy fields."""
    name, _, rest = spec.partition(":")
    args = [a for a in rest.split(":") if a] if rest else []
    cls = POLICIES.get(name)
    if cls is not None and len(args) == len(cls.spec_args):
        try:
            return {"name": name, **{k: int(v) for k, v in zip(cls.spec_args, args, strict=True)}}
        except ValueError:
            pass
    raise WindowConfigError(f"window_policy {spec!r} is not one of: {spec_usage()} (integers)")


def build_policy(name: str, *, max_len: int, candidates: Sequence[int] = (), threshold: float = 0.7,
                 initial: int | None = None, window: int | None = None, start: int | None = None,
                 step: int | None = None, options: Mapping[str, float] | None = None) -> WindowPolicy:
    """Build a policy from plain fields (what configs and the controller's register call carry)."""
    fields = PolicyFields(max_len=max_len, candidates=tuple(candidates), threshold=threshold, initial=initial,
                          window=window, start=start, step=step, options=dict(options or {}))
    return policy_class(name).from_fields(fields)


def policy_from_state(state: Mapping[str, Any]) -> WindowPolicy:
    """Rebuild a policy from its ``state_dict()``."""
    name = state.get("name")
    if name not in POLICIES:
        raise WindowConfigError(f"unknown policy name in state: {name!r}")
    return POLICIES[name].from_state(state)
