"""The GPU check's verl run (``gpu_check``, checks 2, 4 and 6): adwin's main with a TaskRunner whose trainer, an
``AdwinRayPPOTrainer`` (verl's v1 trainer: ``gpu_check_runner_v1``'s ``AdwinPPOTrainerSync``), records what each step did as JSON lines in the file ``+gpu_check.record`` names: each
training generation (window, probe copies' lengths, seconds), each ``update_actor`` batch (row lengths, probe copies
in it, teacher logprobs, ``uid``), each weight sync, each audit, and each step's seconds."""

from __future__ import annotations

import json
import time
from typing import Any

import hydra
import ray
from verl.trainer.main_ppo import run_ppo

from adwin.trainer_adapters.verl.fields import MAX_TOKENS, PROBE, scalar
from adwin.trainer_adapters.verl.main import VERL_CONFIG, prepare
from adwin.trainer_adapters.verl.rows import split
from adwin.trainer_adapters.verl.support import uses_v1
from adwin.trainer_adapters.verl.task_runner import _AdwinTaskRunner
from adwin.trainer_adapters.verl.trainer import AdwinRayPPOTrainer


class RecordingTrainer(AdwinRayPPOTrainer):
    """adwin's trainer, recording (module docstring)."""

    def _record(self, event: str, **fields: Any) -> None:
        with open(self.config.gpu_check.record, "a") as f:
            f.write(json.dumps({"event": event, "step": int(self.global_steps), **fields}) + "\n")

    def init_workers(self) -> None:
        super().init_workers()
        self._updated, self._last_start = False, None
        manager, sync = self.async_rollout_manager, self.checkpoint_manager.update_weights
        generate = manager.generate_sequences

        def recorded_generate(prompts: Any) -> Any:
            if prompts.meta_info.get("validate", False):
                return generate(prompts)
            start = time.perf_counter()
            if self._last_start is not None:
                self._record("metrics", of_step=int(self.global_steps) - 1, step_s=start - self._last_start,
                             gen_s=self._last_gen)
            out = generate(prompts)
            self._last_start, self._last_gen = start, time.perf_counter() - start
            _, copies = split(manager.last_output, len(prompts))
            lengths, caps, eos = [], [], []
            if copies is not None:
                lengths = copies.batch["attention_mask"][:, copies.batch["prompts"].shape[1]:].sum(-1).tolist()
                caps = [int(scalar(c)) for c in copies.non_tensor_batch[MAX_TOKENS]]
                last = [int(copies.batch["responses"][b, max(n - 1, 0)]) for b, n in enumerate(lengths)]
                eos = [t == self.tokenizer.eos_token_id for t in last]
            self._record("generate", window=int(self.adwin.last_window), copy_lengths=lengths, copy_caps=caps,
                         copy_ended_eos=eos, gen_s=self._last_gen)
            self._updated = False
            return out

        def recorded_sync(*args: Any, **kwargs: Any) -> Any:
            out = sync(*args, **kwargs)
            self._record("sync")
            return out

        manager.generate_sequences = recorded_generate
        self.checkpoint_manager.update_weights = recorded_sync

    def _update_actor(self, batch: Any) -> Any:
        nt = batch.non_tensor_batch
        self._record("update", response_lengths=batch.batch["response_mask"].sum(-1).tolist(),
                     probe_rows=int(sum(bool(p) for p in nt.get(PROBE, []))),
                     teacher_logprobs="teacher_logprobs" in batch.batch.keys(), uid="uid" in nt)
        self._updated = True
        return super()._update_actor(batch)

    def _adwin_audit(self, job: Any) -> Any:
        start = time.perf_counter()
        out = super()._adwin_audit(job)
        self._record("audit", after_update=self._updated, seconds=time.perf_counter() - start)
        return out


class _RecordingTaskRunner(_AdwinTaskRunner):
    def trainer_class(self) -> type:
        return RecordingTrainer


RecordingTaskRunner = ray.remote(_RecordingTaskRunner)


@hydra.main(config_path=VERL_CONFIG, config_name="ppo_trainer", version_base=None)
def main(config: Any) -> None:
    prepare(config)
    if uses_v1(config):
        from adwin.trainer_adapters.verl.gpu_check_runner_v1 import RecordingTaskRunnerV1

        run_ppo(config, task_runner_class=RecordingTaskRunnerV1)
    else:
        run_ppo(config, task_runner_class=RecordingTaskRunner)
