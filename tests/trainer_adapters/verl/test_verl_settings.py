"""The ``adwin`` section of a verl config (verl-free)."""

from __future__ import annotations

import pytest

from adwin.controller import Controller, RemoteController
from adwin.trainer_adapters.verl.settings import adwin_config


def test_the_run_spec_takes_verls_response_length_as_the_horizon():
    cfg = adwin_config({"candidates": [128, 256], "probe_batch_size": 4, "audit": {"method": "sketch"}})
    spec = cfg.run_spec(1024)
    assert spec.policy.max_len == 1024 and spec.policy.candidates == [128, 256] and spec.probe_batch_size == 4
    assert cfg.audit.method == "sketch" and cfg.audit.budget is None  # every ready batch unless a budget is set
    assert isinstance(cfg.build_controller(), Controller)
    assert isinstance(adwin_config({"controller": "http://127.0.0.1:8470"}).build_controller(), RemoteController)
    assert adwin_config({"audit": {"budget": 0.2}, "model_params": [10, 20]}).audit.budget == 0.2


@pytest.mark.parametrize("section,field", [({"threshold": 1.5}, "adwin.threshold"), ({"windw": 3}, "adwin.windw"),
                                           ({"audit": {"method": "exact"}}, "adwin.audit.method"),
                                           ({"offers_per_step": 4}, "offers_per_step"),
                                           ({"probe_every": 0}, "adwin.probe_every")])
def test_a_bad_section_fails_naming_the_field(section, field):
    with pytest.raises(ValueError, match=field):
        adwin_config(section)
