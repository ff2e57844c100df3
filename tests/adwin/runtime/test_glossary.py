"""The metrics glossary (docs/metrics.md) documents every key the code logs, and nothing that is gone."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_fixtures import tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.trainer import train
from adwin.runtime.glossary import (
    KEYS,
    NAMESPACES,
    documented,
    emitted_keys,
    pattern_regex,
    render,
    undocumented,
)
from adwin.trainer_adapters.asyncopd.run import run_asyncopd

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def logged_keys(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every key of short sync runs (inline and thread probes) and a short AsyncOPD run, all probing."""
    tmp = tmp_path_factory.mktemp("glossary")
    keys: set[str] = set()
    for backend in ("inline", "thread"):
        cfg = load_config(None, tiny_overrides(tmp, **{"probes.backend": backend, "name": backend}))
        keys |= {k for row in train(cfg, Controller()).history for k in row}
    cfg = load_config(None, tiny_overrides(tmp, **{"name": "async", "scheduler": "asyncopd",
                                                   "loss.name": "reverse_kl_mc"}))
    keys |= {k for row in run_asyncopd(cfg, Controller())["logged"] for k in row}
    return keys


def test_the_glossary_page_is_generated_from_the_code() -> None:
    assert (ROOT / "docs" / "metrics.md").read_text() == render(), \
        "docs/metrics.md is out of date: python -m adwin.runtime.glossary > docs/metrics.md"


def test_every_literal_key_in_the_code_is_documented() -> None:
    found = emitted_keys(ROOT)
    missing = {k: sorted(found[k]) for k in undocumented(found)}
    assert not missing, f"document these keys in adwin/runtime/glossary.py KEYS: {missing}"


def test_every_key_a_run_logs_is_documented(logged_keys: set[str]) -> None:
    assert "audit/submitted" in logged_keys and "async/version" in logged_keys  # the runs did probe and stream
    assert not undocumented(logged_keys), "document these keys in adwin/runtime/glossary.py KEYS"


def test_nothing_documented_is_gone_from_the_code(logged_keys: set[str]) -> None:
    seen = set(emitted_keys(ROOT)) | logged_keys
    stale = [p for p in KEYS if not any(pattern_regex(p).match(k) for k in seen)]
    assert not stale, f"these documented keys are no longer logged anywhere: {stale}"


def test_every_namespace_has_keys_and_every_key_a_namespace() -> None:
    assert all(any(k.startswith(ns + "/") for k in KEYS) for ns in NAMESPACES)
    assert all(k == "step" or k.split("/", 1)[0] in NAMESPACES for k in KEYS)


def test_a_key_matches_its_pattern_and_not_a_neighbours() -> None:
    assert documented("audit/micro_cos_64") == "audit/micro_cos_<c>"
    assert documented("drift/survival_5_at_128") == "drift/survival_<k>_at_<c>"
    assert documented("audit/micro_cos_") is None
    assert documented("nonsense/key") is None
