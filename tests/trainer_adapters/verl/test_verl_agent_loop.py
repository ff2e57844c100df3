"""``AdwinAgentLoop`` on verl's real ``SingleTurnAgentLoop``, driven through verl's ``LLMServerClient``."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("verl.protocol")  # not "verl": without verl, this folder is a namespace package "verl"

from verl_fixtures import RESPONSE_LEN, LocalReplica, agent_loop  # noqa: E402

from adwin.trainer_adapters.verl.fields import (  # noqa: E402
    MAX_TOKENS,
    PROBE,
    REQUEST,
    SESSIONS,
    WINDOW,
    BadWindow,
)


def _run(replica, **fields):
    """One row through ``AdwinAgentLoop`` (built inside the event loop, as verl's worker builds it per row)."""
    from adwin.trainer_adapters.verl.agent_loop import AdwinAgentLoop

    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}

    async def go():
        loop = agent_loop(AdwinAgentLoop, replica)
        return await loop.run(params, raw_prompt=[{"role": "user", "content": "w3 w4 w5"}], **fields)

    return asyncio.run(go()), params


def test_registered_in_verls_agent_loop_registry():
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from adwin.trainer_adapters.verl.agent_loop import AGENT_NAME, AdwinAgentLoop

    assert _agent_loop_registry[AGENT_NAME]["_target_"] == f"{AdwinAgentLoop.__module__}.{AdwinAgentLoop.__qualname__}"


def test_training_row_is_capped_at_the_window_and_marked():
    replica = LocalReplica()
    out, params = _run(replica, **{MAX_TOKENS: np.int64(5), PROBE: np.bool_(False),
                                                               WINDOW: 5, REQUEST: "r0"})
    assert replica.seen[-1]["max_tokens"] == 5
    assert len(out.response_ids) == 5
    assert out.extra_fields[PROBE] is False and out.extra_fields[MAX_TOKENS] == 5 and out.extra_fields[REQUEST] == "r0"
    assert "max_tokens" not in params  # verl reuses the dict across rows


def test_probe_row_goes_out_at_full_length_whatever_its_cap():
    replica = LocalReplica()
    out, _ = _run(replica, **{MAX_TOKENS: 4, PROBE: True, WINDOW: 4, REQUEST: "r0:probe"})
    assert replica.seen[-1]["max_tokens"] == RESPONSE_LEN
    assert len(out.response_ids) == RESPONSE_LEN
    assert out.extra_fields[PROBE] is True and out.extra_fields[WINDOW] == 4


def test_under_verls_v1_trainer_a_session_past_the_training_ones_is_a_probe_copy():
    """verl's v1 worker runs a prompt's sessions with one set of fields and its ``session_id``."""
    fields = {MAX_TOKENS: 4, WINDOW: 4, PROBE: False, SESSIONS: np.int64(2)}
    for session, probe, cap in ((0, False, 4), (1, False, 4), (2, True, RESPONSE_LEN), (3, True, RESPONSE_LEN)):
        replica = LocalReplica()
        out, _ = _run(replica, session_id=session, **fields)
        assert replica.seen[-1]["max_tokens"] == cap and len(out.response_ids) == cap
        assert out.extra_fields[PROBE] is probe and out.extra_fields[WINDOW] == 4


@pytest.mark.parametrize("cap", [0, RESPONSE_LEN + 1, 2.5, "8"])
def test_a_bad_cap_is_a_typed_error_before_any_request(cap):
    replica = LocalReplica()
    with pytest.raises(BadWindow):
        _run(replica, **{MAX_TOKENS: cap, PROBE: False})
    assert replica.seen == []


def test_a_row_without_adwin_fields_is_generated_as_single_turn():
    replica = LocalReplica()
    out, _ = _run(replica)
    assert "max_tokens" not in replica.seen[-1] and PROBE not in out.extra_fields
