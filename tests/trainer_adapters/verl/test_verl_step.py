"""verl steps on CPU with the real pieces that run without GPUs: the driver plans a ``DataProto``, ``AdwinAgentLoop``
generates each row through verl's ``LLMServerClient`` (local generator), verl's own ``AgentLoopWorker`` post-processing
pads it and lays out the teacher's logprobs, the rows go back to the driver, and the actor's audit (verl's loss on
the student) decides the next window. Not here: Ray, vLLM and verl's FSDP actor (tests/trainer_adapters/verl/
gpu_recipe.sh)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("verl.protocol")  # not "verl": without verl, this folder is a namespace package "verl"

from tiny_models import make_tiny_llama  # noqa: E402
from verl_audit_fixtures import distillation_config  # noqa: E402
from verl_fixtures import PROMPT_LEN, RESPONSE_LEN, LocalReplica, agent_loop, tokenizer  # noqa: E402

from adwin.controller import Controller  # noqa: E402
from adwin.controller.schemas import PolicyIn, RunIn  # noqa: E402
from adwin.trainer_adapters.verl.driver import VerlWindowDriver, WorkerAuditor  # noqa: E402
from adwin.trainer_adapters.verl.fields import PROBE  # noqa: E402
from adwin.trainer_adapters.verl.rollout import AdwinRolloutManager  # noqa: E402
from adwin.trainer_adapters.verl.rows import items_of, split  # noqa: E402

CANDIDATES, ROWS = [4, 8], 4


class LocalTeacher:
    """verl's teacher manager interface on a tiny Llama, answering as vLLM's prompt logprobs do: entry ``i`` is
    log q of token ``i + 1`` (the last entry 0), one column (verl's single-sample estimators)."""

    def __init__(self) -> None:
        self.model = make_tiny_llama(seed=7)

    def log_q(self, ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logp = torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), -1)  # (n, V)
        return logp[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)  # (n - 1,): log q(ids[i + 1])

    async def compute_teacher_logprobs_single(self, sequence_ids: list[int], **kwargs: Any):
        lq = torch.cat([self.log_q(sequence_ids), torch.zeros(1)])[:, None]  # (n, 1)
        ids = torch.tensor(sequence_ids[1:] + [0], dtype=torch.int32)[:, None]
        return ids, lq


class LocalRewardWorker:
    """verl's reward-loop worker interface (``compute_score.remote(data)``, awaitable as a Ray actor method is),
    scoring every row 0: verl's trainer hands the agent loop these handles when no reward model is configured."""

    def __init__(self) -> None:
        self.compute_score, self.scored = self, 0

    def remote(self, data: Any) -> Any:
        self.scored += len(data)

        async def score() -> dict[str, Any]:
            return {"reward_score": 0.0, "reward_extra_info": {}}

        return score()


def _worker(teacher: LocalTeacher, reward_handles: list[Any] | None = None) -> Any:
    """verl's ``AgentLoopWorker`` post-processing without Ray or a model path (the attributes it reads);
    ``reward_handles`` as verl's trainer passes them (None: a reward model on the actor's pool)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    w = object.__new__(AgentLoopWorker)
    w.rollout_config = SimpleNamespace(prompt_length=PROMPT_LEN, response_length=RESPONSE_LEN)
    w.tokenizer, w.processor, w.mm_processor_kwargs = tokenizer(), None, {}
    w.reward_loop_worker_handles = reward_handles
    w.distillation_enabled, w.teacher_key, w.teacher_server_manager = True, "data_source", teacher
    return w


def _gen_batch(version: int) -> Any:
    from verl import DataProto

    prompts = [[{"role": "user", "content": f"w{3 + i} w{10 + i} w{20 + i}"}] for i in range(ROWS // 2)]
    raw = np.empty(ROWS, dtype=object)
    raw[:] = [prompts[i // 2] for i in range(ROWS)]  # rollout.n = 2: two rows per prompt, one uid
    uid = np.array([f"v{version}-p{i // 2}" for i in range(ROWS)], dtype=object)
    return DataProto.from_dict(tensors={"index": torch.arange(ROWS)}, non_tensors={"raw_prompt": raw, "uid": uid})


class LocalManager:
    """verl's agent-loop manager interface: the batch split evenly over its workers (verl's ``DataProto.chunk``, which
    refuses an uneven split), each chunk as ``AgentLoopWorker.generate_sequences`` does it."""

    def __init__(self, replica: LocalReplica, worker: Any, workers: int = 4) -> None:
        self.replica, self.worker, self.last = replica, worker, None
        self.agent_loop_workers = [worker] * workers

    def generate_sequences(self, batch: Any) -> Any:
        from verl import DataProto

        chunks = batch.chunk(len(self.agent_loop_workers))
        self.last = DataProto.concat([_generate(c, self.replica, self.worker) for c in chunks])
        return self.last


def _generate(batch: Any, replica: LocalReplica, worker: Any) -> Any:
    """What verl's ``AgentLoopWorker.generate_sequences`` does with each row, in one event loop."""
    from adwin.trainer_adapters.verl.agent_loop import AdwinAgentLoop

    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}

    async def go():
        outs = []
        for i in range(len(batch)):
            kwargs = {k: v[i] for k, v in batch.non_tensor_batch.items()}
            loop = agent_loop(AdwinAgentLoop, replica)
            out = await loop.run(params, **kwargs)
            outs.append(await worker._agent_loop_postprocess(out, False, **kwargs))
        return worker._postprocess(outs, input_non_tensor_batch=batch.non_tensor_batch)

    return asyncio.run(go())


@pytest.fixture(params=["verl's default: reward loop", "reward model"])
def setup(request):
    student = make_tiny_llama(seed=0)
    cfg = distillation_config("k1")
    from adwin.trainer_adapters.verl.actor import audit_in_actor

    run = RunIn(run_id="verl-step", policy=PolicyIn(name="adwin", candidates=CANDIDATES, max_len=RESPONSE_LEN,
                                                    threshold=0.05), probe_batch_size=2, offers_per_step=2)
    driver = VerlWindowDriver(Controller(), run, max_len=RESPONSE_LEN,
                              auditor=WorkerAuditor(lambda job: audit_in_actor(student, job, cfg)))
    teacher = LocalTeacher()
    handles = [LocalRewardWorker()] if request.param.startswith("verl's default") else None
    return driver, LocalReplica(seed=1), _worker(teacher, handles), teacher


def _step(driver: VerlWindowDriver, replica: LocalReplica, worker: Any, version: int):
    """One step as ``AdwinRayPPOTrainer`` runs it: the wrapped manager generates, the actor updates, the audit runs."""
    inner = LocalManager(replica, worker)
    manager = AdwinRolloutManager(inner, driver, lambda: version)
    train = manager.generate_sequences(_gen_batch(version))
    _, probes = split(manager.last_output, ROWS)
    plan = SimpleNamespace(window=int(train.non_tensor_batch["adwin_window"][0]),
                           probes=[] if probes is None else list(range(len(probes))), generated=len(inner.last))
    return plan, train, probes, items_of(manager.last_output, version, RESPONSE_LEN), driver.after_update(version + 1)


def test_probe_copies_reach_full_length_and_stay_out_of_the_training_rows(setup):
    driver, replica, worker, _ = setup
    plan, train, probes, _, _ = _step(driver, replica, worker, 0)
    lp = train.batch["prompts"].shape[1]
    assert len(train) == ROWS and not any(train.non_tensor_batch[PROBE])
    assert train.batch["attention_mask"][:, lp:].sum(dim=1).tolist() == [plan.window] * ROWS
    assert len(plan.probes) == 2 and probes is not None and all(probes.non_tensor_batch[PROBE])
    assert probes.batch["attention_mask"][:, lp:].sum(dim=1).tolist() == [RESPONSE_LEN] * 2
    assert plan.generated == 8  # 4 rows + 2 copies padded to the 4 agent-loop workers, the padding dropped after


def test_items_carry_verls_teacher_scores_of_each_response_token(setup):
    driver, replica, worker, teacher = setup
    _, _, _, items, _ = _step(driver, replica, worker, 0)
    for it in items:
        expected = teacher.log_q(it.prompt_ids + it.tokens)[len(it.prompt_ids) - 1 :]  # log q of each response token
        assert it.teacher_logprobs == pytest.approx(expected.tolist(), abs=1e-5)


def test_windows_move_on_audits_of_verls_loss(setup):
    driver, replica, worker, _ = setup
    windows, decided = [], []
    for version in range(3):
        plan, _, _, _, metrics = _step(driver, replica, worker, version)
        windows.append(plan.window)
        cos = dict(driver.hooks.client.record.last_cosines)
        assert metrics.get("audit/submitted", 0) or cos  # an audit ran on this step's probe copies
        decided.append(min((c for c in CANDIDATES if cos[c] >= 0.05), default=RESPONSE_LEN))
    assert windows[0] == max(CANDIDATES)  # before any audit: the largest candidate
    assert windows[1:] == decided[:-1]  # then what the previous step's audit decided
    assert len(set(windows)) > 1


def test_every_row_keeps_its_prompt_whatever_verls_reward_setup(setup):
    """verl copies the input's ``uid`` to its output only without a reward loop; its default setup has one."""
    driver, replica, worker, _ = setup
    plan, _, _, items, _ = _step(driver, replica, worker, 0)
    uids = [f"v0-p{i // 2}" for i in range(ROWS)]  # _gen_batch: rollout.n = 2
    train, copies = items[:ROWS], items[ROWS:]
    assert [it.prompt_id for it in train] == uids
    assert copies and all(it.prompt_id in uids and it.is_probe for it in copies)
    probe_rows = [int(it.request_id.split("-")[-1].split(":")[0]) for it in copies]  # "<nonce>-v0-<row>:probe"
    assert [it.prompt_id for it in copies] == [uids[i] for i in probe_rows]
    if worker.reward_loop_worker_handles is not None:
        assert worker.reward_loop_worker_handles[0].scored == plan.generated  # verl's reward loop scored every row
