"""Property-based: any value for any config field either validates or fails naming that field."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from adwin.config import TrainConfig, load_config

FIELDS = [
    "seed", "steps", "rollout.prompts_per_step", "rollout.samples_per_prompt", "rollout.max_response_len",
    "rollout.temperature", "rollout.top_p", "window.threshold", "window.candidates", "window.initial",
    "probes.batch_size", "probes.staleness_limit", "probes.max_active", "probes.lookahead", "audit.sketch_dim",
    "optim.lr", "optim.grad_clip", "eval.every", "eval.k", "controller.port", "window.policy", "audit.method",
]
junk = st.one_of(
    st.integers(min_value=-(10**9), max_value=10**9),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-5, max_value=5000), max_size=6),
    st.none(),
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(FIELDS), value=junk)
def test_any_bad_value_is_rejected_naming_its_field(field, value):
    try:
        cfg = load_config(None, {field: value})
    except ValidationError as e:
        leaf = field.split(".")[-1]
        text = str(e)
        assert leaf in text or "window" in text, text
        return
    assert isinstance(cfg, TrainConfig)
    # whatever validated must still be internally consistent
    assert all(c <= cfg.rollout.max_response_len for c in cfg.window.candidates)
