"""The window-policy fields, declared once: the config's ``window`` section (``adwin.config.WindowSection``)
and the controller's register schema (``PolicyIn``) both inherit ``PolicyKnobs``, and ``build_policy``
takes exactly these fields (plus ``max_len`` and ``options``) into ``PolicyFields``.

Bounds stay within what the controller's store (SQLite int64) and the dashboard (JavaScript numbers) hold.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

MAX_INT = 2**53 - 1
PositiveCount = Annotated[int, Field(ge=1, le=MAX_INT)]
Candidates = list[PositiveCount]
# the candidate windows of configs that name none (a 320-token horizon's worth of lines on the built-in task)
DEFAULT_CANDIDATES: tuple[int, ...] = (32, 64, 128, 192, 256)


class PolicyKnobs(BaseModel):
    """What a policy is built from besides its name, the horizon and its policy-specific options."""

    candidates: Candidates = Field(default_factory=list, description="increasing window lengths an audit picks from")
    threshold: float = Field(0.7, gt=0.0, le=1.0, description="cosine a candidate must reach")
    initial: int | None = Field(None, ge=1, le=MAX_INT, description="window before the first audit; None: the largest candidate")
    window: int | None = Field(None, ge=1, le=MAX_INT, description="fixed: the window")
    start: int | None = Field(None, ge=1, le=MAX_INT, description="linear: the first window")
    step: int | None = Field(None, ge=0, le=MAX_INT, description="linear: added per optimizer step")

    def knobs(self) -> dict[str, Any]:
        """These fields as ``build_policy`` keywords."""
        return {k: getattr(self, k) for k in PolicyKnobs.model_fields}
