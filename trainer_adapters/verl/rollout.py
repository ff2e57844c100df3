"""``AdwinRolloutManager``: verl's agent-loop manager with the driver's plan around each training generation.

It wraps the manager verl's trainer calls (``generate_sequences(DataProto) -> DataProto``): the driver's window and
probe copies go in as row fields, the probe copies come out (reported to the controller, never trained on) and
the training rows are returned exactly as many as were asked for. Validation batches pass through untouched.
Importing it needs no verl (it reads the manager and ``DataProto`` by their methods; padding is verl's own).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import uuid4

from adwin.trainer_adapters.verl.driver import VerlWindowDriver
from adwin.trainer_adapters.verl.rows import items_of, planned_batch, split


class AdwinRolloutManager:
    """See the module docstring. ``version()`` is the learner version (updates applied) of the next generation."""

    def __init__(self, inner: Any, driver: VerlWindowDriver, version: Callable[[], int]) -> None:
        self.inner, self.driver, self.version = inner, driver, version
        self.last_metrics: dict[str, float] = {}
        self.last_output: Any = None  # the last training generation, probe copies included (padding removed)
        self._nonce = uuid4().hex[:8]  # request ids unique across restarts of a resumed run

    def generate_sequences(self, prompts: Any) -> Any:
        if prompts.meta_info.get("validate", False):
            return self.inner.generate_sequences(prompts)
        version, n = self.version(), len(prompts)
        requests = [f"{self._nonce}-v{version}-{i}" for i in range(n)]
        uids = [str(u) for u in prompts.non_tensor_batch.get("uid", requests)]  # verl sets uid; a row alone otherwise
        plan = self.driver.plan(version, list(zip(requests, uids, strict=True)))
        out = self.last_output = self._generate(planned_batch(prompts, plan, requests, uids, self.driver.max_len))
        self.last_metrics = plan.metrics | self.driver.collect(version, items_of(out, version, self.driver.max_len))
        return split(out, n)[0]

    def _generate(self, batch: Any) -> Any:
        """verl's manager splits a batch evenly over its agent-loop workers: the probe copies may break that, so
        the batch is padded with repeats of its first (window-capped) rows, and their outputs dropped."""
        from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto

        workers = len(getattr(self.inner, "agent_loop_workers", None) or [None])
        padded, pad = pad_dataproto_to_divisor(batch, workers)
        return unpad_dataproto(self.inner.generate_sequences(padded), pad)

    def __getattr__(self, name: str) -> Any:  # everything else is the wrapped manager's
        return getattr(self.inner, name)
