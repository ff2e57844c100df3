"""The policy registry is the one list of policies: config, controller schema, CLI shorthand and
capabilities all come from it, and nothing else in the code compares policy names."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from adwin.config import WindowSection
from adwin.controller.schemas import PolicyIn
from adwin.policies.base import WindowConfigError, WindowPolicy
from adwin.policies.registry import (
    POLICIES,
    POLICY_NAMES,
    build_policy,
    is_audited,
    parse_policy_spec,
    policy_from_state,
)

ROOT = Path(__file__).resolve().parents[3]
FIELDS = {"max_len": 64, "candidates": [8, 16, 32], "threshold": 0.7, "window": 16, "start": 8, "step": 4}


def test_config_and_controller_schema_accept_exactly_the_registered_names():
    for model, field in ((WindowSection, "policy"), (PolicyIn, "name")):
        assert set(typing.get_args(model.model_fields[field].annotation)) == set(POLICY_NAMES)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_builds_round_trips_its_state_and_parses_its_shorthand(name):
    policy = build_policy(name, **FIELDS)
    assert isinstance(policy, WindowPolicy) and policy.name == name
    again = policy_from_state(policy.state_dict())
    assert type(again) is type(policy) and again.state_dict() == policy.state_dict()
    cls = POLICIES[name]
    spec = ":".join([name, *(str(FIELDS[a]) for a in cls.spec_args)])
    assert parse_policy_spec(spec) == {"name": name, **{a: FIELDS[a] for a in cls.spec_args}}


def test_only_adwin_is_audited():
    assert [n for n in POLICY_NAMES if is_audited(n)] == ["adwin"]


def test_unknown_names_fail_naming_the_known_ones():
    with pytest.raises(WindowConfigError, match="one of adwin, full"):
        build_policy("nope", max_len=8)
    with pytest.raises(WindowConfigError, match="fixed:WINDOW"):
        parse_policy_spec("fixed")
    with pytest.raises(WindowConfigError, match="unknown policy"):
        policy_from_state({"name": "nope"})


def test_no_module_outside_the_registry_compares_policy_names():
    pattern = re.compile(r"""(policy|name)\S*\s*[!=]=\s*["'](adwin|full|fixed|linear|surprise)["']""")
    offenders = []
    for folder in ("adwin", "controller", "probes", "trainer_adapters"):
        for path in (ROOT / folder).rglob("*.py"):
            if "bench" in path.parts:
                continue  # benchmarks name the methods they compare
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, "use the registry's capabilities (is_audited, ...):\n" + "\n".join(offenders)
