"""What every config section shares: strict models and the importance-ratio fields (``loss.is_*`` and ``probes.is_*``).

The bottom of the config package: every other module of it may import this one, and it imports none of them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from adwin.objectives.importance import ISMethod


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# The importance-ratio treatment (adwin.objectives.importance), defined once: the training loss (loss.is_*)
# and the probe audit (probes.is_*) each weight their own stale tokens, so each section has its own values.
ISMethodField = Annotated[ISMethod, Field(description="old-to-current ratio treatment: none | clip | cap | icepop")]
ISLowField = Annotated[float, Field(ge=0.0, description="lower ratio bound (clip, icepop)")]
ISHighField = Annotated[float, Field(gt=0.0, description="upper ratio bound (clip, cap, icepop)")]


def _off_word(value: Any) -> Any:
    return "off" if value is False else value


# YAML 1.1 (PyYAML, and so every config file and --set value) reads the bare word off as false: a field whose
# values include "off" takes it back, so `model.autocast: off` means what it says
OffWord = BeforeValidator(_off_word)


def check_is_bounds(section: str, method: str, low: float, high: float) -> None:
    """``importance_weights`` needs ``low <= high``: refuse at load time, naming the section's fields."""
    if method != "none" and low > high:
        raise ValueError(f"{section}.is_low ({low}) must be <= {section}.is_high ({high}) with "
                         f"{section}.is_method={method!r}")
