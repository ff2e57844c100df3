"""The audit of a sharded student (FSDP2 over 2 gloo ranks, ``model.sharding: fsdp``), fully fine-tuned or LoRA
(adapters trained, base frozen, in the same FSDP units), equals the 1-process audit on the same weights and AdamW
state, for ``fast`` and ``sketch`` with the identity and the Adam metric (the Adam metric reading the sharded
optimizer's moments); the gradient norm of a sharded backward is the 1-process one; a LoRA student decodes
compiled on its gathered weights to the eager tokens."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch.multiprocessing as mp
from ddp_runs import AUDIT_CANDIDATES, sharded_audit_worker

from adwin.loop.distributed import free_port

pytest.importorskip("peft")  # the lora extra: the LoRA variant runs in the same process group
VARIANTS = ["full", "lora"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("sharded-audit") / "audits.json"
    mp.spawn(sharded_audit_worker, args=(2, free_port(), str(out)), nprocs=2, join=True)
    return json.loads(out.read_text())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("method", ["fast", "sketch"])
@pytest.mark.parametrize("metric", ["identity", "adam"])
def test_sharded_audit_equals_the_one_process_audit(ranks: dict, variant: str, method: str, metric: str) -> None:
    res = ranks[variant][f"{method}-{metric}"]
    one, many = res["one"], res["many"]
    for c in map(str, AUDIT_CANDIDATES):
        assert many["cos"][c] == pytest.approx(one["cos"][c], abs=1e-6), c
    gram_one, gram_many = np.array(one["gram"]), np.array(many["gram"])
    assert np.abs(gram_many - gram_one).max() <= 1e-6 * np.abs(gram_one).max()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("method", ["fast", "sketch"])
def test_the_adam_metric_weights_the_audit(ranks: dict, variant: str, method: str) -> None:
    """The parity above means something for ``adam`` only if its weights reached the audit."""
    res = ranks[variant]
    identity, adam = res[f"{method}-identity"]["many"]["cos"], res[f"{method}-adam"]["many"]["cos"]
    assert max(abs(identity[c] - adam[c]) for c in identity) > 1e-3


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_sharded_gradient_norm_is_the_one_process_norm(ranks: dict, variant: str) -> None:
    one, many = ranks[variant]["grad_norm"]
    assert one > 0 and many == pytest.approx(one, rel=1e-6)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_rank_with_no_rows_to_decode_leaves_no_other_rank_waiting(ranks: dict, variant: str) -> None:
    assert ranks[variant]["generated"] == 1  # rank 0's row; rank 1 had none and returned too (else the spawn fails)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_audit_leaves_the_student_and_its_optimizer_sharded_and_its_gradients_untouched(
        ranks: dict, variant: str) -> None:
    after = ranks[variant]["after"]
    assert (after["dtensor_params"], after["grads"], after["sharded_moments"]) == (True, 0, True)


def test_a_lora_student_sharded_trains_its_adapters_only(ranks: dict) -> None:
    """The frozen base (the fully fine-tuned student's parameters) is sharded with the adapters (every parameter a
    DTensor), and the optimizer holds the adapters only."""
    full, lora = ranks["full"]["after"], ranks["lora"]["after"]
    assert full["moments"] == full["trainable"] == full["parameters"]
    assert lora["moments"] == lora["trainable"] == lora["parameters"] - full["parameters"] > 0


def test_a_sharded_lora_student_decodes_compiled_to_the_eager_tokens(ranks: dict) -> None:
    assert ranks["lora"]["compiled"] is True
