from __future__ import annotations

import os

import pytest
import torch

# Several suites share 2 cores; one intra-op thread keeps tests from oversubscribing.
torch.set_num_threads(1)
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def tiny_llama():
    from tiny_models import make_tiny_llama

    return make_tiny_llama()


# The packages whose tests compare numbers (losses, gradients, audit cosines, logprobs, decoded tokens): their
# results depend on the CPU's float kernels, so .ci/run runs them again under each ATEN_CPU_CAPABILITY
# (tests/numerics.py says what each parity test promises). A test elsewhere opts in with @pytest.mark.numerics.
NUMERIC_PACKAGES = ("adwin/audit", "adwin/loop", "adwin/objectives", "adwin/sampling", "adwin/teacher")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = os.path.dirname(__file__)
    for item in items:
        rel = os.path.relpath(str(item.path), root).replace(os.sep, "/")
        if rel.startswith(tuple(p + "/" for p in NUMERIC_PACKAGES)):
            item.add_marker(pytest.mark.numerics)

