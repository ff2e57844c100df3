"""The per-row fields adwin adds to a verl batch, and the window check every side applies.

A verl row carries them in ``non_tensor_batch`` on the way to the agent loop (each row's dataset fields are the
loop's keyword arguments) and in the sample's ``extra_fields`` on the way back (verl copies every extra field into
the output's ``non_tensor_batch``, whatever its reward setup).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from adwin.trainer_adapters.hooks import BadWindowAnswer

MAX_TOKENS = "adwin_max_tokens"  # the response cap of this request: the window, or the horizon for a probe
PROBE = "adwin_probe"  # True on a probe row: generated to the horizon, audited, never trained on
WINDOW = "adwin_window"  # the window in force when the row was planned (a probe's too)
REQUEST = "adwin_request"  # the row's request id (a probe copy's is its probe id)
# the row's prompt (verl's ``uid``): verl copies the input's own fields to its output only without a reward loop,
# and its default setup (no reward model) has one, so the prompt travels as one of adwin's fields
PROMPT = "adwin_prompt"
# verl's v1 trainer sends each prompt once and its agent-loop worker runs ``__rollout_n__`` sessions of it: sessions
# ``0 .. adwin_sessions - 1`` are training rows, the ones after them the prompt's probe copies
SESSIONS = "adwin_sessions"


# one type for a window no request can be capped at, whether the controller answered it (the hooks refuse it) or
# a row carries it to the agent loop
BadWindow = BadWindowAnswer


def check_window(window: Any, max_len: int, *, what: str = "window") -> int:
    """``window`` as an int in ``[1, max_len]``, else ``BadWindow`` naming ``what`` (nothing has been sent yet)."""
    if isinstance(window, bool) or not isinstance(window, int | float) or int(window) != window:
        raise BadWindow(f"{what} must be an integer in [1, {max_len}], got {window!r}")
    if not 1 <= int(window) <= max_len:
        raise BadWindow(f"{what} must be in [1, {max_len}] (rollout.response_length), got {int(window)}")
    return int(window)


def scalar(value: Any) -> Any:
    """A field as a plain Python value (verl hands non-tensor fields over as numpy scalars or 0-d arrays)."""
    return value.item() if isinstance(value, np.generic | np.ndarray) and np.ndim(value) == 0 else value
