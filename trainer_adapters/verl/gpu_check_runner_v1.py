"""The GPU check's verl run under verl's v1 trainer (``gpu_check --trainer v1``): ``AdwinPPOTrainerSync`` recording
the events ``gpu_check_runner`` records for the legacy trainer, read where the v1 trainer has them: the sampled
batch's probe copies (from TransferQueue, before they are cleared), each ``update_actor`` batch, each weight sync,
each audit, and each step's seconds (generation: from ``on_sample_begin`` to ``on_sample_end``)."""

from __future__ import annotations

import json
import time
from typing import Any

import ray
import transfer_queue as tq

from adwin.trainer_adapters.verl.fields import MAX_TOKENS, scalar
from adwin.trainer_adapters.verl.rows_v1 import session_key
from adwin.trainer_adapters.verl.trainer_v1 import AdwinPPOTrainerSync, _AdwinTaskRunnerV1


def _read(keys: list[str], partition: str, name: str) -> list[Any] | None:
    """One stored column of ``keys``, a value a row (None when the rows do not carry it)."""
    try:
        column = tq.kv_batch_get(keys=keys, partition_id=partition, select_fields=[name])[name]
    except Exception:  # noqa: BLE001  (a column the rows lack is what the record says)
        return None
    return list(column.unbind(0)) if getattr(column, "is_nested", False) else list(column)


class RecordingTrainerV1(AdwinPPOTrainerSync):
    """adwin's v1 trainer, recording (module docstring)."""

    def _record(self, event: str, **fields: Any) -> None:
        with open(self.config.gpu_check.record, "a") as f:
            f.write(json.dumps({"event": event, "step": int(self.global_steps), **fields}) + "\n")

    def init(self) -> None:
        self._updated, self._last_start, self._last_gen, self._sample_start = False, None, 0.0, 0.0
        self._copies: set[str] = set()
        super().init()

    def on_init_end(self) -> None:
        super().on_init_end()
        self._record("sync")

    def on_step_begin(self) -> None:
        start = time.perf_counter()
        if self._last_start is not None:
            self._record("metrics", of_step=int(self.global_steps) - 1, step_s=start - self._last_start,
                         gen_s=self._last_gen)
        self._last_start = start
        super().on_step_begin()

    def on_sample_begin(self) -> None:
        self._sample_start = time.perf_counter()
        super().on_sample_begin()

    def on_sample_end(self) -> None:
        super().on_sample_end()
        self._last_gen = time.perf_counter() - self._sample_start

    def on_step_end(self) -> None:
        super().on_step_end()
        self._record("sync")

    def adwin_collect(self, batch: Any) -> Any:
        copies = [k for k in batch.keys if session_key(k) in self._probe_ids]
        self._copies |= {session_key(k) for k in copies}
        lengths, caps, eos = [], [], []
        if copies:
            responses = _read(copies, batch.partition_id, "responses") or []
            lengths = [int(r.shape[0]) for r in responses]
            eos = [bool(int(r[-1]) == self.tokenizer.eos_token_id) if len(r) else False for r in responses]
            extra = _read(copies, batch.partition_id, "extra_fields")  # the agent loop's cap of each copy
            caps = [None if e is None else int(scalar(dict(e).get(MAX_TOKENS))) for e in (extra or [None] * len(copies))]
        window = self._plan.window if self._plan is not None else None
        self._record("generate", window=window, copy_lengths=lengths, copy_caps=caps, copy_ended_eos=eos,
                     gen_s=time.perf_counter() - self._sample_start)
        self._updated = False
        return super().adwin_collect(batch)

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        keys = list(batch.keys)
        mask = _read(keys, batch.partition_id, "response_mask") or []
        self._record("update", response_lengths=[int(m.sum()) for m in mask],
                     probe_rows=sum(session_key(k) in self._copies for k in keys),
                     teacher_logprobs=_read(keys, batch.partition_id, "teacher_logprobs") is not None,
                     uid=_read(keys, batch.partition_id, "uid") is not None)
        self._updated = True
        return super()._update_actor(batch, metrics)

    def _adwin_audit(self, job: Any) -> Any:
        start = time.perf_counter()
        out = super()._adwin_audit(job)
        self._record("audit", after_update=self._updated, seconds=time.perf_counter() - start)
        return out


class _RecordingTaskRunnerV1(_AdwinTaskRunnerV1):
    def trainer_class(self) -> type:
        return RecordingTrainerV1


RecordingTaskRunnerV1 = ray.remote(_RecordingTaskRunnerV1)
