"""adwin's rollout worker for TRL's ``AsyncDistillationTrainer`` (``trl.experimental.async_distillation``, trl 1.16).

TRL's async trainer takes a ``rollout_worker`` (its ``RolloutWorkerProtocol``: ``rollout_buffer``, ``metrics_queue``,
``start``, ``stop``, ``update_model_version``, ``check_health``) and a ``weight_transfer`` (``pause``,
``send_weights``, ``resume``, ...). Its own worker generates in a spawned child against the student's vLLM server with
``max_tokens`` fixed when the child starts, so no window can reach it. ``AdwinRolloutWorker`` is one that can:

- it runs in the trainer's process, on a thread, generating with adwin's decode engine (``adwin.decode.engine.HFEngine``)
  on its own copy of the student (the *generator*); ``worker.weight_transfer`` is TRL's weight sync into that copy
  (``pause`` waits for the batch being generated, ``send_weights`` loads the streamed tensors, ``resume`` lets the
  thread go on), so generation overlaps training as with TRL's worker, without a server;
- each request is planned by the one fresh-probe driver (``adwin.trainer_adapters.hooks.ControllerWindowHooks``,
  ``plan_request``): a training request gets ``max_tokens`` = the controller's current window, a probe the full
  horizon. Training rows go to ``rollout_buffer`` as TRL's ``RolloutSample`` (teacher top-k scored by the local
  ``teacher``, the layout TRL's server scoring produces); probe rows are never trained on: they go, full length and
  marked ``is_probe``, to ``probe_rows``, which ``AdwinCallback`` drains after each optimizer step and audits on the
  trainer's side (``trainer_adapters.trl_async_driver``);
- versions: a row carries the optimizer step whose weights generated it (adwin's version) and TRL's
  ``model_version`` of the same weights (TRL's staleness filter reads it).

``AdwinCallback.attach(trainer)`` binds the worker to the trainer (dataset, tokenizer, sampling settings, the
generator copy) and to the run; before that, ``start`` refuses to run.

Not supported (refused at ``attach``, before the run is registered, naming the field): TRL's ``top_k``, ``min_p`` and ``repetition_penalty``
(adwin's sampler implements temperature and top-p), and several teacher servers (MOPD): the teacher is one local
module. A vLLM-backed generator is not provided.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from adwin.decode.engine import HFEngine
from adwin.decode.static_cache import CompileSetting, without_compiled
from adwin.sampling.rollout import layout
from adwin.trainer_adapters.asyncopd.items import StreamItem

log = logging.getLogger(__name__)


class RolloutWorkerFailed(RuntimeError):
    """The rollout thread stopped with an error (chained) or stopped ticking; raised where TRL checks its health."""


class EngineWeights:
    """TRL's ``WeightTransferProtocol`` into the worker's generator: the trainer's weight sync, in process."""

    def __init__(self, worker: AdwinRolloutWorker) -> None:
        self.worker = worker

    def init_weight_transfer(self) -> None:
        return None  # the generator is a copy of the student in this process: nothing to connect

    def pause(self) -> None:
        self.worker._gate.acquire()  # waits for the batch being generated: no row mixes two weight versions

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.worker.load_weights(iterator)

    def resume(self) -> None:
        self.worker._gate.release()

    def destroy(self) -> None:
        return None


class AdwinRolloutWorker:
    """A TRL ``RolloutWorkerProtocol`` that generates at the controller's window (module docstring).

    ``teacher``: the local teacher module scoring the training rows (top ``args.teacher_top_k`` per position at
    ``args.teacher_temperature``) and, through ``AdwinCallback``, the probe batches. ``requests_per_batch``: requests
    one generation call decodes together (default: the rollouts of one optimizer step,
    ``per_device_train_batch_size x gradient_accumulation_steps``). ``compile``: decode on a static
    cache with transformers' compiled step (``adwin.decode.static_cache``; off by default). ``seed``: every request
    samples with its own seed derived from it, so rows do not depend on the thread's timing. Pass
    ``weight_transfer=worker.weight_transfer`` to the trainer with ``rollout_worker=worker``.
    """

    def __init__(self, teacher: torch.nn.Module, *, requests_per_batch: int | None = None,
                 compile: CompileSetting = False, seed: int = 0) -> None:
        if requests_per_batch is not None and requests_per_batch < 1:
            raise ValueError(f"requests_per_batch must be >= 1, got {requests_per_batch}")
        self.teacher = teacher.eval()
        self.requests_per_batch = requests_per_batch
        self.compile = compile
        self.seed = seed
        self.rollout_buffer: queue.Queue = queue.Queue()  # TRL's RolloutSample rows, drained by the trainer
        self.metrics_queue: queue.Queue = queue.Queue(maxsize=4096)  # drained by the trainer's log()
        self.probe_rows: queue.Queue[StreamItem] = queue.Queue()  # full-length probes, drained by AdwinCallback
        self.weight_transfer = EngineWeights(self)
        self.version = 0  # optimizer steps behind the generator's weights (adwin's version)
        self.trl_version = 0  # TRL's model_version of the same weights
        self.hooks: Any = None  # ControllerWindowHooks, set by bind
        self.engine: HFEngine | None = None
        self._gate = threading.Lock()  # held while a batch generates, and by the trainer's weight sync
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._heartbeat = time.time()
        self._served = 0  # requests planned so far: request ids and per-request seeds

    # --- wiring (AdwinCallback.attach) --------------------------------------------------------------

    def check(self, trainer: Any) -> None:
        """Refuse (``ValueError``, naming the field) what this worker cannot do for ``trainer``."""
        args = trainer.args
        for name, default in (("top_k", 0), ("min_p", None), ("repetition_penalty", 1.0)):
            if getattr(args, name) != default:
                raise ValueError(f"AdwinRolloutWorker samples with temperature and top_p only: {name}="
                                 f"{getattr(args, name)!r} is not supported (leave it at {default!r})")
        if len(args.teacher_server_urls) != 1:
            raise ValueError(f"AdwinRolloutWorker scores with one local teacher: teacher_server_urls names "
                             f"{len(args.teacher_server_urls)} teachers (MOPD is not supported)")
        if trainer.train_dataset is None or len(trainer.train_dataset) == 0:
            raise ValueError("AdwinRolloutWorker needs a non-empty train_dataset with a 'prompt' column")

    def bind(self, trainer: Any, hooks: Any) -> None:
        """Take the trainer's dataset, tokenizer and sampling settings, copy its student as the generator, and plan
        requests with ``hooks`` (a ``ControllerWindowHooks`` that has read its first window)."""
        from trl.experimental.async_distillation.async_rollout_worker import RolloutSample

        self.check(trainer)
        args = trainer.args
        self._sample_cls = RolloutSample
        self.trainer, self.hooks = trainer, hooks
        self.tokenizer = trainer.processing_class
        self.pad_id = int(self.tokenizer.pad_token_id)
        student = trainer.accelerator.unwrap_model(trainer.model)
        self.engine = HFEngine(_generator_of(student), set(trainer.eos_token_ids), self.pad_id, compile=self.compile)
        self.teacher_id = next(iter(args.teacher_server_urls))  # the trainer's single teacher id
        self.requests = self.requests_per_batch or int(args.per_device_train_batch_size) * int(
            args.gradient_accumulation_steps)
        # rows queued or being generated ahead of the trainer: TRL's bound for its own worker's requests in flight
        # (max_staleness x samples per step), beyond which rows reach the trainer older than it accepts
        per_step = int(args.per_device_train_batch_size) * int(args.gradient_accumulation_steps)
        self.ahead = max(self.requests, min(int(args.max_inflight_tasks), max(1, int(args.max_staleness)) * per_step))

    # --- RolloutWorkerProtocol ----------------------------------------------------------------------

    def start(self) -> None:
        if self.hooks is None:
            raise RuntimeError("AdwinRolloutWorker is bound by AdwinCallback.attach(trainer) before training")
        if self._thread is not None:
            return
        self._stop.clear()
        self._error = None
        self._heartbeat = time.time()
        self._thread = threading.Thread(target=self._run, name="adwin-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            if self._thread.is_alive():
                log.warning("AdwinRolloutWorker: the rollout thread did not stop within 60 s")
            self._thread = None

    def update_model_version(self, model_version: int) -> None:
        self.trl_version = int(model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise RolloutWorkerFailed(f"the rollout thread failed: {type(self._error).__name__}: {self._error}") \
                from self._error
        age = time.time() - self._heartbeat
        if self._thread is not None and age > stale_after_s:
            raise RolloutWorkerFailed(f"the rollout thread has not ticked for {age:.0f} s (> {stale_after_s:.0f} s)")

    # --- weights --------------------------------------------------------------------------------------

    def load_weights(self, named: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Load the trainer's streamed tensors (TRL's base-checkpoint names) into the generator (gate held)."""
        if self.engine is None:
            raise RuntimeError("AdwinRolloutWorker received weights before AdwinCallback.attach bound it")
        params = dict(self.engine.model.named_parameters())
        with torch.no_grad():
            for name, tensor in named:
                if name not in params:
                    raise KeyError(f"weight sync: the generator has no parameter {name!r}")
                params[name].copy_(tensor)
        self.version = int(self.trainer.state.global_step)
        # TRL bumps model_version right after resume() and then calls update_model_version with it: rows the thread
        # generates from here on are of that version (none can start before resume releases the gate)
        self.trl_version = int(self.trainer.model_version) + 1

    # --- the rollout thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._heartbeat = time.time()
                if self.rollout_buffer.qsize() + self.requests > self.ahead:  # more would only age in the queue
                    time.sleep(0.01)
                    continue
                with self._gate:
                    self._one_batch()
        except BaseException as e:  # reported by check_health, where TRL's dataset polls the worker
            self._error = e
            log.exception("AdwinRolloutWorker: the rollout thread failed")

    def _one_batch(self) -> None:
        """Plan, generate and emit ``requests`` requests: training rows to TRL, probe rows to ``probe_rows``."""
        assert self.engine is not None  # bound
        version, trl_version = self.version, self.trl_version
        ds = self.trainer.train_dataset
        ids = list(range(self._served, self._served + self.requests))
        self._served += self.requests
        rows = [ds[i % len(ds)] for i in ids]
        plans = [self.hooks.plan_request(f"trl-{i}", f"p{i % len(ds)}", version) for i in ids]
        prompts = [encode_prompt(self.tokenizer, r["prompt"], self.trainer.args.chat_template_kwargs) for r in rows]
        args = self.trainer.args
        gen = self.engine.generate(prompts, [p.max_tokens for p in plans], temperature=args.temperature,
                                   top_p=args.top_p, with_logprobs=True,
                                   row_seeds=[self.seed * 1_000_003 + i for i in ids])
        train = [b for b, p in enumerate(plans) if not p.is_probe]
        scored = teacher_topk(self.teacher, [prompts[b] for b in train], [gen.response_ids[b] for b in train],
                              k=int(args.teacher_top_k), temperature=float(args.teacher_temperature), pad_id=self.pad_id)
        for b, (top_ids, top_lps) in zip(train, scored, strict=True):
            self.rollout_buffer.put(self._sample(rows[b], ids[b], prompts[b], gen.response_ids[b], top_ids, top_lps,
                                                 trl_version, plans[b].window))
        for b, p in enumerate(plans):
            if p.is_probe:
                self.probe_rows.put(_probe_row(f"trl-{ids[b]}", f"p{ids[b] % len(ds)}", prompts[b],
                                               gen.response_ids[b], gen.logprobs[b] if gen.logprobs else [],
                                               version, p.window, p.max_tokens, gen.finished[b]))
        n_tokens = sum(len(gen.response_ids[b]) for b in train)
        self._push({"completions/mean_length": (float(n_tokens), float(len(train)))})  # TRL's own key, as a rate

    def _sample(self, row: dict, prompt_id: int, prompt: list[int], completion: list[int], top_ids: np.ndarray,
                top_lps: np.ndarray, trl_version: int, window: int) -> Any:
        """One training row in TRL's layout (``RolloutSample``): ``window`` rides along as a per-sample metric, so
        TRL logs the window of the rows it trained on (``window/rollout``)."""
        text = self.tokenizer.decode(completion, skip_special_tokens=False)
        return self._sample_cls(
            prompt=row["prompt"], completion=[{"role": "assistant", "content": text}],
            input_ids=np.asarray(prompt + completion, dtype=np.int64),
            completion_mask=np.asarray([0] * len(prompt) + [1] * len(completion), dtype=np.int64),
            teacher_topk_ids=top_ids, teacher_topk_logprobs=top_lps, model_version=trl_version,
            metrics={"window/rollout": float(window)}, teacher_id=self.teacher_id, prompt_id=prompt_id,
            enqueued_at=time.time())

    def _push(self, values: dict[str, Any]) -> None:
        try:
            self.metrics_queue.put_nowait(values)
        except queue.Full:
            pass  # a trainer that stops logging must never block generation


def _generator_of(student: torch.nn.Module) -> torch.nn.Module:
    """The worker's own copy of the student, under the names TRL streams (a PEFT student: merged, base names)."""
    gen = without_compiled(copy.deepcopy(student))
    if hasattr(gen, "merge_and_unload"):  # TRL merges the adapter for the sync and streams base-checkpoint names
        gen = gen.merge_and_unload()
    return gen.eval().requires_grad_(False)


def _probe_row(request_id: str, prompt_id: str, prompt: list[int], tokens: list[int], logprobs: list[float],
               version: int, window: int, max_tokens: int, finished: bool) -> StreamItem:
    """A full-length probe as the fresh-probe driver's completed item (``hooks.StampedItem``), marked ``is_probe``."""
    item = StreamItem(request_id, 0, prompt_id, list(prompt), "default", window, max_tokens, True, version)
    item.tokens, item.logprobs, item.token_versions = list(tokens), list(logprobs), [version] * len(tokens)
    item.finish_reason = "eos" if finished else "horizon"
    return item


def encode_prompt(tokenizer: Any, prompt: Any, chat_kwargs: dict | None = None) -> list[int]:
    """Token ids of a dataset prompt: a conversation through the chat template (as TRL's worker), text as is."""
    if isinstance(prompt, str):
        ids = tokenizer(prompt)["input_ids"]
    else:
        ids = tokenizer.apply_chat_template(prompt, return_dict=False, add_generation_prompt=True, **(chat_kwargs or {}))
    if not ids:
        raise ValueError(f"prompt {str(prompt)[:40]!r} encodes to no tokens")
    return [int(i) for i in ids]


@torch.no_grad()
def teacher_topk(teacher: torch.nn.Module, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], *,
                 k: int, temperature: float, pad_id: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per row, TRL's sparse teacher scoring of ``prompt + completion``: ``(len, k + 1)`` ids and logprobs, row ``i``
    the teacher's top ``k`` candidates for token ``i`` (rank order, at ``temperature``) plus the realized token when it
    is outside them; prompt rows and unused slots padded with id -1 / logprob -inf (what TRL's server scoring gives)."""
    if not prompts:
        return []
    rows = layout(prompts, completions, pad_id)
    device = next(teacher.parameters()).device
    ids, am = rows.input_ids.to(device), rows.attention_mask.to(device)  # (B, L)
    logits = teacher(input_ids=ids, attention_mask=am, position_ids=(am.cumsum(1) - 1).clamp_min(0)).logits
    logp = torch.log_softmax(logits.float() / temperature, dim=-1).cpu()  # (B, L, V): column j predicts token j + 1
    out = []
    for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        n_p, n_c = len(p), len(c)
        top_ids = np.full((n_p + n_c, k + 1), -1, dtype=np.int64)
        top_lps = np.full((n_p + n_c, k + 1), -np.inf, dtype=np.float32)
        if n_c:
            pos = logp[b, n_p - 1 : n_p - 1 + n_c]  # (C, V): the distributions the completion tokens were drawn at
            lps, cand = pos.topk(k, dim=-1)  # (C, k) rank order
            real = torch.as_tensor(list(c), dtype=torch.long)  # (C,)
            outside = ~(cand == real[:, None]).any(dim=-1)  # (C,) the realized token is not a top-k candidate
            real_lp = pos.gather(-1, real[:, None]).squeeze(-1)  # (C,)
            top_ids[n_p:, :k], top_lps[n_p:, :k] = cand.numpy(), lps.numpy()
            top_ids[n_p:, k] = torch.where(outside, real, -1).numpy()
            top_lps[n_p:, k] = torch.where(outside, real_lp, float("-inf")).numpy()
        out.append((top_ids, top_lps))
    return out
