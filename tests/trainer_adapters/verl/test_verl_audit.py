"""The audit in verl's actor: adwin's audit math under verl's own distillation loss, summed over data-parallel ranks.

verl's actor itself (Ray workers, its FSDP engine) needs GPUs and is not run here: its audit entry point
``audit_in_actor`` is, on the module such an actor holds (a tiny Llama), with verl's loss functions and a gloo group."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("verl.protocol")  # not "verl": without verl, this folder is a namespace package "verl"

import torch.multiprocessing as mp  # noqa: E402
from tiny_models import make_tiny_llama  # noqa: E402
from verl_audit_fixtures import (  # noqa: E402
    CANDIDATES,
    distillation_config,
    dp_audit_worker,
    fsdp2_actor_audit_worker,
    job,
)

from adwin.audit.alignment import audit  # noqa: E402
from adwin.loop.distributed import free_port  # noqa: E402


def _verl(method: str = "fast", **cfg):
    from adwin.trainer_adapters.verl.actor import audit_in_actor

    return audit_in_actor(make_tiny_llama(seed=0), job(method), distillation_config(**cfg)).result


@pytest.mark.numerics
@pytest.mark.parametrize("method", ["fast", "reference"])
def test_verl_k1_policy_gradient_audit_matches_adwins_own_audit(method):
    """verl's recommended OPD loss (k1 as a reward, policy gradient) has adwin's reverse-KL gradient: same cosines."""
    ours = audit(make_tiny_llama(seed=0), job(method).batch, CANDIDATES, method=method, macro=False)
    theirs = _verl(method)
    for c in CANDIDATES:
        assert theirs.cosines[c] == pytest.approx(ours.cosines[c], abs=1e-6)
    assert np.abs(theirs.gram - ours.gram).max() <= 1e-6 * np.abs(ours.gram).max()
    assert theirs.tokens_per_segment == ours.tokens_per_segment == [16, 16, 21]


@pytest.mark.numerics
def test_verl_k3_supervised_audit_is_the_k3_gradient():
    """A supervised verl loss (k3 backpropagated) is audited as k3, not as adwin's policy gradient."""
    def k3(logp, teacher, mask):  # verl's low_var_kl: exp(q - p) - (q - p) - 1, clamped to [-10, 10]
        d = teacher - logp
        return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0) * mask

    expected = audit(make_tiny_llama(seed=0), job().batch, CANDIDATES, loss=k3, macro=False)
    theirs = _verl(loss_mode="k3", policy_gradient=False)
    for c in CANDIDATES:
        assert theirs.cosines[c] == pytest.approx(expected.cosines[c], abs=1e-6)
    pg = _verl()
    assert max(abs(theirs.cosines[c] - pg.cosines[c]) for c in CANDIDATES) > 1e-4  # the loss reached the audit


def test_a_top_k_loss_is_refused():
    from adwin.trainer_adapters.verl.loss import UnsupportedDistillationLoss, verl_token_loss

    with pytest.raises(UnsupportedDistillationLoss):
        verl_token_loss(distillation_config("forward_kl_topk", policy_gradient=False))


@pytest.mark.numerics
def test_the_audit_summed_over_two_gloo_ranks_is_the_one_process_audit(tmp_path):
    out = tmp_path / "rank0.json"
    mp.spawn(dp_audit_worker, args=(2, free_port(), str(out)), nprocs=2, join=True)
    many = json.loads(out.read_text())
    one = _verl()
    for c in CANDIDATES:
        assert many["cos"][str(c)] == pytest.approx(one.cosines[c], abs=1e-6)
    assert np.abs(np.array(many["gram"]) - one.gram).max() <= 1e-6 * np.abs(one.gram).max()
    assert many["tokens"] == one.tokens_per_segment


@pytest.mark.parametrize(("backend", "device"), [("cpu:gloo,cuda:nccl", "cuda"), ("nccl", "cuda"), ("gloo", "cpu"),
                                                 ("cpu:gloo,cuda:gloo", "cpu")])
def test_the_dp_sum_runs_on_the_gpu_under_verls_per_device_backend(monkeypatch, backend, device):
    import adwin.trainer_adapters.verl.actor as actor

    # verl's actor group reports "cpu:gloo,cuda:nccl"; no GPU here, so the group's backend string is given
    monkeypatch.setattr(actor.dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert actor.GroupDist(rank=0, world=2, local_rank=0, group=object())._device().type == device


@pytest.mark.numerics
def test_the_audit_leaves_verls_fsdp2_actor_as_it_found_it(tmp_path):
    """verl shards its actor with ``reshard_after_forward`` on every module, the root included; an audit on gathered
    weights must not leave adwin's own settings behind (a root that keeps its gathered embedding after forward)."""
    out = tmp_path / "fsdp2.json"
    mp.spawn(fsdp2_actor_audit_worker, args=(free_port(), str(out)), nprocs=1, join=True)
    got = json.loads(out.read_text())
    assert got["before"][0] == [False, [[1, True]]]  # verl's root: reshards after forward and after backward
    assert got["after"] == got["before"]
    assert got["root_gathered_after_forward"] is False
    one = _verl()
    for c in CANDIDATES:
        assert got["cos"][str(c)] == pytest.approx(one.cosines[c], abs=1e-6)  # the audit ran on the whole weights
