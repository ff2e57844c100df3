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
