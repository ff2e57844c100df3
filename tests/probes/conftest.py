from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster (num_cpus=2) for every Ray test: start-up costs seconds on 2 cores."""
    ray = pytest.importorskip("ray")
    from adwin.probes.ray_actor import ensure_ray

    started = not ray.is_initialized()
    ensure_ray(None, num_cpus=2)
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The built-in task's ``tiny`` assets, prepared once per session into a private ADWIN_HOME."""
    from adwin import tasks

    home = tmp_path_factory.mktemp("adwin-home")
    tasks.ensure_prepared(home=home, profile="tiny", seed=0)
    return home
