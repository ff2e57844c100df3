"""Property-based: any value for any config field either validates or fails naming that field, as a
``ValidationError`` (or a one-line ``ValueError`` for config structure), never a traceback from deep inside."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from adwin.config import TrainConfig, load_config
from adwin.train import config_error


def _leaves(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    for name, f in model.model_fields.items():
        ann = f.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _leaves(ann, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


FIELDS = sorted(_leaves(TrainConfig))  # every field, so a new one is covered the day it is added
SECTIONS = sorted(n for n, f in TrainConfig.model_fields.items()
                  if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel))
junk = st.one_of(
    st.integers(min_value=-(10**9), max_value=10**9),
    st.integers(min_value=2**63, max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(min_value=-5, max_value=5000), max_size=6),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    st.none(),
    st.booleans(),
)


def _check_rejection(e: Exception, names: list[str]) -> None:
    text = str(e)
    assert any(n in text for n in names) or "window" in text or "data.path" in text, text
    line = config_error(e)  # what the CLI prints: one line, naming the field
    assert "\n" not in line and any(n in line for n in names) or "window" in line or "data.path" in line, line


def _consistent(cfg: TrainConfig) -> None:
    assert all(c <= cfg.rollout.max_response_len for c in cfg.window.candidates)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(FIELDS), value=junk)
def test_any_bad_value_is_rejected_naming_its_field(field: str, value: Any) -> None:
    try:
        cfg = load_config(None, {field: value})
    except ValidationError as e:
        _check_rejection(e, [field.split(".")[-1]])
        return
    _consistent(cfg)  # whatever validated must still be internally consistent


@settings(max_examples=150, deadline=None)
@given(overrides=st.dictionaries(st.sampled_from(FIELDS), junk, min_size=2, max_size=5))
def test_several_bad_values_fail_naming_one_of_them(overrides: dict[str, Any]) -> None:
    try:
        cfg = load_config(None, overrides)
    except ValidationError as e:
        _check_rejection(e, [f.split(".")[-1] for f in overrides])
        return
    _consistent(cfg)


@settings(max_examples=100, deadline=None)
@given(section=st.sampled_from(SECTIONS), value=junk, unknown=st.text("abcxyz_", min_size=1, max_size=6))
def test_bad_sections_and_unknown_keys_are_named(section: str, value: Any, unknown: str) -> None:
    try:
        load_config(None, {section: value})
    except ValidationError as e:
        _check_rejection(e, [section])
    field = next(f for f in FIELDS if f.startswith(f"{section}."))
    try:  # a scalar section, then one of its fields: a one-line structure error, not a TypeError
        load_config(None, {section: 5, field: 1})
    except (ValidationError, ValueError) as e:
        _check_rejection(e, [section])
    try:
        load_config(None, {f"{section}.{unknown}_": 1})
    except ValidationError as e:
        _check_rejection(e, [f"{unknown}_"])
    else:
        raise AssertionError(f"unknown key {section}.{unknown}_ was accepted")


yaml_values = st.recursive(junk, lambda kids: st.dictionaries(st.sampled_from(SECTIONS + ["steps", "x"]), kids,
                                                              max_size=3), max_leaves=8)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=yaml_values)
def test_any_yaml_document_validates_or_fails_with_one_line(tmp_path: Path, doc: Any) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    try:
        cfg = load_config(path)
    except (ValidationError, ValueError) as e:  # ValidationError is a ValueError
        assert "\n" not in config_error(e) and config_error(e)
        return
    _consistent(cfg)
