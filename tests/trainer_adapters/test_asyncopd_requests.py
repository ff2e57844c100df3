"""The request stream a checkpoint records: what a resumed AsyncOPD run submits again, and in which order."""

from __future__ import annotations

import itertools

from adwin.trainer_adapters.asyncopd.items import PromptSpec
from adwin.trainer_adapters.asyncopd.requests import RequestStream


def _source():
    n = itertools.count()
    return lambda: PromptSpec(f"p{next(n)}", [1, 2, 3])


def test_a_restored_stream_replays_unconsumed_training_requests_first_with_their_ids() -> None:
    before = RequestStream(_source(), samples_per_prompt=2)
    reqs = [before.next() for _ in range(5)]  # p0/0 p0/1 p1/0 p1/1 p2/0; p2/1 drawn, not submitted
    for r, probe in zip(reqs, (False, False, True, False, False), strict=True):
        before.submitted(r, probe)
    before.done(reqs[0].seq)  # trained on
    state = before.state_dict()
    assert state["dropped_probes"] == [reqs[2].request_id]

    after = RequestStream(_source(), samples_per_prompt=2)
    after.load_state_dict(state)
    replayed = [after.next() for _ in range(4)]
    assert [r.request_id for r in replayed[:3]] == [reqs[1].request_id, reqs[3].request_id, reqs[4].request_id]
    assert replayed[2].sample == 0 and replayed[3].sample == 1 and replayed[3].spec.prompt_id == "p2"
    assert replayed[3].seq == 5, "the request drawn before the checkpoint gets the seq it would have had"
    # each group closes at its last replayed request (the feeder then counts its training requests)
    assert [r.closes_group for r in replayed] == [True, True, False, True]
    nxt = after.next()  # then the source continues (its position is the run state's prompts)
    assert (nxt.spec.prompt_id, nxt.seq, nxt.group) == ("p0", 6, 3)
