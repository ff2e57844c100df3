"""``AdwinAgentLoop``: verl's single-turn agent loop with each request capped at the controller's window.

Registered in verl's agent-loop registry as ``adwin`` (``actor_rollout_ref.rollout.agent.default_agent_loop=adwin``;
a Ray worker that has not imported this module finds it through ``agent.agent_loop_config_path``, docs/adapters.md).
The row's ``adwin_max_tokens`` field (set by the driver: the window, or the horizon on a probe copy) becomes the
request's ``max_tokens``; a probe copy (``adwin_probe``) always goes out at the full ``rollout.response_length``. The
fields go back in the sample's ``extra_fields``, so the driver can tell probe copies from training rows in verl's
output batch, and which prompt each row came from (``adwin_prompt``, verl's ``uid``), whatever verl's reward
setup. A row without them is generated as ``SingleTurnAgentLoop`` does. A cap that is not an integer in
``[1, response_length]`` is a ``BadWindow`` before any request is sent. A trainer config adwin cannot run under is
refused by name when the loop is built (``support.check_verl_config``).

Under verl's v1 trainer a prompt row is sent once and verl runs its ``rollout.n`` sessions (``session_id``) in the
agent-loop worker; the row's ``adwin_sessions`` says how many are training rows, and a session at or past it is a
probe copy (``trainer_v1.py`` raises verl's per-prompt ``__rollout_n__`` by the prompt's copies).
"""

from __future__ import annotations

from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from adwin.trainer_adapters.verl.fields import (
    MAX_TOKENS,
    PROBE,
    PROMPT,
    REQUEST,
    SESSIONS,
    WINDOW,
    check_window,
    scalar,
)
from adwin.trainer_adapters.verl.support import check_verl_config

AGENT_NAME = "adwin"


@register(AGENT_NAME)
class AdwinAgentLoop(SingleTurnAgentLoop):
    """See the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        check_verl_config(self.config)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        cap = scalar(kwargs.pop(MAX_TOKENS, None))
        probe = bool(scalar(kwargs.pop(PROBE, False)))
        window = scalar(kwargs.pop(WINDOW, None))
        request = scalar(kwargs.pop(REQUEST, None))
        prompt = scalar(kwargs.pop(PROMPT, None))
        sessions = scalar(kwargs.pop(SESSIONS, None))
        if sessions is not None and int(kwargs.get("session_id", 0)) >= int(sessions):
            probe = True  # a v1 probe copy (module docstring)
        params = dict(sampling_params)  # verl reuses the dict across rows: never change the caller's
        if probe:
            params["max_tokens"] = self.response_length  # the horizon: what the audit compares the window against
        elif cap is not None:
            params["max_tokens"] = check_window(cap, self.response_length, what=MAX_TOKENS)
        output = await super().run(params, **kwargs)
        if cap is not None or probe:
            output.extra_fields.update({PROBE: probe, MAX_TOKENS: int(params["max_tokens"]),
                                        WINDOW: None if window is None else int(window), REQUEST: request,
                                        PROMPT: prompt})
        return output
