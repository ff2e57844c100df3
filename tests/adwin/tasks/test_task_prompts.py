"""The built-in task's prompt stream: one fixed sequence per seed, resumable from its state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adwin.sampling.data import DataError, Prompt, PromptStream
from adwin.tasks import ROUTES
from adwin.tasks.prompts import BuiltinPrompts, builtin_prompts


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 50), served=st.integers(0, 40), more=st.integers(1, 20))
def test_builtin_stream_restored_from_its_state_continues_like_the_uninterrupted_stream(
        seed: int, served: int, more: int) -> None:
    straight = BuiltinPrompts(seed)
    head = straight.next_batch(served)
    restored = BuiltinPrompts(seed)
    restored.load_state_dict(straight.state_dict())
    assert restored.next_batch(more) == straight.next_batch(more)
    # the stream is one fixed sequence: how it is read (or how long the run is) does not change it
    assert head == builtin_prompts(served, seed, "train")


def test_builtin_stream_covers_every_route_and_refuses_a_foreign_state() -> None:
    stream = BuiltinPrompts(0)
    assert {p.route for p in stream.route_examples()} == set(ROUTES)
    with pytest.raises(DataError, match="seed 1"):
        stream.load_state_dict(BuiltinPrompts(1).state_dict())
    with pytest.raises(DataError, match="'shuffled' stream"):  # e.g. a checkpoint of an older adwin
        stream.load_state_dict(PromptStream([Prompt("a", "p")]).state_dict())
