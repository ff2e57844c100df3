"""adwin's rollout worker for TRL's ``AsyncDistillationTrainer`` (``trl.experimental.async_distillation``, trl 1.16).

TRL's async trainer takes a ``rollout_worker`` (its ``RolloutWorkerProtocol``: ``rollout_buffer``, ``metrics_queue``,
``start``, ``stop``, ``update_model_version``, ``check_health``). Its own worker runs TRL's rollout loop
(``_AsyncRolloutLoop``) in a spawned child with ``max_tokens`` fixed when the child starts, so no window can reach
it. ``AdwinRolloutWorker`` runs the same TRL loop object in the trainer's process, on a thread, and issues every
request itself:

- generation and scoring are TRL's own per-sample path (``_generate_and_score_one``): the chat template, the
  request to the student's vLLM server (``args.vllm_server_base_url``, ``/v1/completions``: sampling settings,
  per-request seed, the LoRA adapter name TRL syncs), the teacher request to TRL's teacher servers
  (``args.teacher_server_urls``, ``prompt_logprobs = teacher_top_k``, MOPD routing by the row's ``teacher_id``),
  TRL's retries and rollout metrics. Weights reach the student's server through TRL's own ``weight_transfer``
  (its default NCCL client, which pauses and resumes the server): the worker holds no model and no teacher;
- each request is planned by the one fresh-probe driver (``adwin.trainer_adapters.hooks.ControllerWindowHooks``,
  ``plan_request``) just before TRL's loop builds it: ``max_tokens`` = the controller's window for a training
  request, the full horizon for a probe. TRL's request reads the loop's ``max_tokens`` while it builds the payload,
  before its first suspension, so concurrent requests each carry their own cap. Training rows go to
  ``rollout_buffer`` as TRL's ``RolloutSample`` (``window/rollout`` stamped in its per-sample metrics); probe rows
  are never trained on: they go, full length and with the teacher's realized-token logprobs read off TRL's top-k
  scoring, to ``probe_rows``, which ``AdwinCallback`` drains after each optimizer step
  (``trainer_adapters.trl_async_driver``);
- versions are counted in weight syncs, TRL's unit: adwin's version of a row is TRL's ``model_version`` at dispatch
  minus one (TRL's cold sync at train begin is version 0, the initial weights), so TRL's ``max_staleness`` and
  adwin's ``staleness_limit`` compare the same numbers;
- a row whose teacher scored an id past the student's output width (a padded teacher not served on the student's
  columns) stops the worker with ``TeacherVocabTooWide``: TRL's loss would index the student's logits there.

``AdwinCallback.attach(trainer)`` binds the worker to the trainer and the run; before that, ``start`` refuses.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from adwin.trainer_adapters.asyncopd.items import StreamItem

log = logging.getLogger(__name__)


class RolloutWorkerFailed(RuntimeError):
    """The rollout thread stopped with an error (chained) or stopped ticking; raised where TRL checks its health."""


class UnsupportedSetting(ValueError):
    """A trainer or audit setting the worker cannot honour; ``field`` names it. Raised at ``attach``, before any
    run is registered or any request sent."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class TeacherMissedToken(ValueError):
    """A teacher server's top-k answer for a probe lacks the realized token (vLLM always lists it)."""


class TeacherVocabTooWide(ValueError):
    """A teacher server scored a token id past the student's vocabulary: its output is wider (padded) than the
    student's, so its logprobs are normalised over columns the student lacks and TRL's loss would index past the
    student's logits. ``adwin teacher serve --vocab-size`` serves only the student's columns."""


@dataclass
class _Value:
    """The ``.value`` holder TRL's loop reads its shared version and heartbeat from (an ``mp.Value`` in its child)."""

    value: Any


class AdwinRolloutWorker:
    """A TRL ``RolloutWorkerProtocol`` that generates on TRL's servers at the controller's window (module docstring).

    Pass it as ``rollout_worker=`` to ``AsyncDistillationTrainer``; leave ``weight_transfer`` to TRL (its default
    streams the student's weights into the vLLM server). ``args.max_inflight_tasks`` bounds the requests in flight,
    ``args.queue_maxsize`` the rows waiting for the trainer, as with TRL's worker.
    """

    def __init__(self) -> None:
        self.rollout_buffer: queue.Queue = queue.Queue()  # TRL's RolloutSample rows, drained by the trainer
        self.metrics_queue: queue.Queue = queue.Queue(maxsize=4096)  # drained by the trainer's log()
        self.probe_rows: queue.Queue[StreamItem] = queue.Queue()  # full-length probes, drained by AdwinCallback
        self.hooks: Any = None  # ControllerWindowHooks, set by bind
        self.loop: Any = None  # TRL's _AsyncRolloutLoop, built by bind
        self.vocab = 0  # the student's output width, set by bind
        self._version = _Value(0)  # TRL's model_version (weight syncs)
        self._heartbeat = _Value(time.time())
        self._failed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # --- wiring (AdwinCallback.attach) --------------------------------------------------------------

    def bind(self, trainer: Any, hooks: Any) -> None:
        """Build TRL's rollout loop from the trainer's arguments, exactly as TRL's trainer builds its own worker's,
        and plan requests with ``hooks`` (a ``ControllerWindowHooks`` that has read its first window)."""
        from trl.experimental.async_distillation.async_rollout_worker import _AsyncRolloutLoop
        from trl.trainer.utils import get_config_model_id

        args = trainer.args
        if trainer.train_dataset is None or len(trainer.train_dataset) == 0:
            raise UnsupportedSetting("train_dataset", "AdwinRolloutWorker needs a non-empty dataset with a "
                                     "'prompt' column")
        self.trainer, self.hooks = trainer, hooks
        model = trainer.accelerator.unwrap_model(trainer.model)
        self.vocab = int(model.get_output_embeddings().weight.shape[0])  # the student's logits' width
        self.rollout_buffer.maxsize = max(0, int(args.queue_maxsize))  # TRL's own worker's bound
        self.loop = _AsyncRolloutLoop(
            model_name=get_config_model_id(model.config),
            lora_name=trainer._lora_name if getattr(trainer, "_lora_sync", False) else None,
            dataset=trainer.train_dataset, processing_class=trainer.processing_class,
            eos_token_ids=trainer.eos_token_ids, rollout_buffer=self.rollout_buffer,
            model_version_value=self._version, heartbeat_value=self._heartbeat, failed_event=self._failed,
            exception_info_queue=queue.Queue(maxsize=1), metrics_queue=self.metrics_queue,
            max_inflight_tasks=max(1, int(args.max_inflight_tasks)), queue_maxsize=int(args.queue_maxsize),
            vllm_server_url=args.vllm_server_base_url, teacher_server_urls=args.teacher_server_urls,
            teacher_top_k=args.teacher_top_k, teacher_temperature=args.teacher_temperature,
            max_tokens=hooks.window, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
            min_p=args.min_p, repetition_penalty=args.repetition_penalty, request_timeout=args.request_timeout,
            chat_template_kwargs=args.chat_template_kwargs, log_completions=False)
        self.loop._loop.close()  # TRL's loop made an event loop for its own run(); the thread runs its coroutines

    # --- RolloutWorkerProtocol ----------------------------------------------------------------------

    def start(self) -> None:
        if self.loop is None:
            raise RuntimeError("AdwinRolloutWorker is bound by AdwinCallback.attach(trainer) before training")
        if self._thread is not None:
            return
        self._stop.clear()
        self._error = None
        self._heartbeat.value = time.time()
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
        self._version.value = int(model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self._error is not None:
            raise RolloutWorkerFailed(f"the rollout thread failed: {type(self._error).__name__}: {self._error}") \
                from self._error
        age = time.time() - self._heartbeat.value
        if self._thread is not None and age > stale_after_s:
            raise RolloutWorkerFailed(f"the rollout thread has not ticked for {age:.0f} s (> {stale_after_s:.0f} s)")

    @property
    def version(self) -> int:
        """adwin's version of the weights the server generates with now: weight syncs after the cold one."""
        return max(0, int(self._version.value) - 1)

    # --- the rollout thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by check_health, where TRL's dataset polls the worker
            self._error = e
            log.exception("AdwinRolloutWorker: the rollout thread failed")

    async def _serve(self) -> None:
        import aiohttp

        loop = self.loop
        limit = loop.max_inflight_tasks
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=2 * limit)) as session:
            loop.session = session
            await loop._resolve_teacher_model_names()  # TRL's readiness wait for the teachers
            rows = loop._repeat_iterator()
            inflight: set[asyncio.Task] = set()
            while not self._stop.is_set():
                self._heartbeat.value = time.time()
                while len(inflight) < limit and not self._room_full():
                    prompt_id, row = next(rows)
                    inflight.add(asyncio.create_task(self._one(prompt_id, row)))
                if not inflight:
                    await asyncio.sleep(0.01)
                    continue
                done, inflight = await asyncio.wait(inflight, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # a failed request stops the thread: check_health raises it where TRL polls
            for task in inflight:
                task.cancel()
            await asyncio.gather(*inflight, return_exceptions=True)

    def _room_full(self) -> bool:
        """The trainer's queue holds as many rows as TRL's bound allows: more would only age in it."""
        bound = self.rollout_buffer.maxsize or self.loop.max_inflight_tasks
        return self.rollout_buffer.qsize() >= bound

    async def _one(self, prompt_id: int, row: dict[str, Any]) -> None:
        """Plan one request, run TRL's generate-and-score path with its cap, route the row."""
        loop = self.loop
        version = self.version
        request, prompt = f"trl-{prompt_id}", f"p{prompt_id % len(loop.dataset)}"
        plan = self.hooks.plan_request(request, prompt, version)
        loop.max_tokens = plan.max_tokens  # read by TRL's request before its first await: this request's cap
        sample = await loop._generate_and_score_one(prompt_id, row)
        widest = int(sample.teacher_topk_ids.max(initial=-1))  # (L, k + 1), -1 where no candidate
        if widest >= self.vocab:  # before TRL's loss gathers the student's logits there (a device assert on GPU)
            raise TeacherVocabTooWide(f"the teacher {sample.teacher_id!r} scored token id {widest}, past the "
                                      f"student's vocabulary of {self.vocab}: serve it on the student's columns "
                                      f"(adwin teacher serve --vocab-size {self.vocab})")
        if plan.is_probe:
            self.probe_rows.put(probe_row(sample, request, prompt, version, plan.window, plan.max_tokens,
                                          loop.eos_token_ids))
            return
        sample.metrics["window/rollout"] = float(plan.window)  # TRL logs the window of the rows it trained on
        while not self._stop.is_set():
            try:
                sample.enqueued_at = time.time()
                self.rollout_buffer.put_nowait(sample)
                return
            except queue.Full:
                await asyncio.sleep(0.05)


def probe_row(sample: Any, request_id: str, prompt_id: str, version: int, window: int, max_tokens: int,
              eos_ids: list[int]) -> StreamItem:
    """A TRL ``RolloutSample`` generated as a probe, as the fresh-probe driver's completed item: its tokens all of
    ``version`` (the dispatch version, the oldest weights a keep-mode sync can leave in it), the teacher's logprob of
    each realized token read off TRL's top-k scoring (vLLM lists the realized token at every position), no behavior
    logprobs (TRL's request asks for none)."""
    n_prompt = int(len(sample.completion_mask) - sample.completion_mask.sum())
    prompt = [int(t) for t in sample.input_ids[:n_prompt]]
    tokens = [int(t) for t in sample.input_ids[n_prompt:]]
    ids, lps = sample.teacher_topk_ids[n_prompt:], sample.teacher_topk_logprobs[n_prompt:]  # (C, k + 1)
    hit = ids == np.asarray(tokens, dtype=np.int64)[:, None]  # (C, k + 1)
    if len(tokens) and not hit.any(axis=1).all():
        j = int(np.flatnonzero(~hit.any(axis=1))[0])
        raise TeacherMissedToken(f"probe {request_id}: the teacher {sample.teacher_id!r} did not score "
                                 f"the realized token at completion position {j}")
    teacher = [float(lps[j][hit[j]][0]) for j in range(len(tokens))]
    item = StreamItem(request_id, 0, prompt_id, prompt, "default", window, max_tokens, True, version)
    item.tokens, item.token_versions, item.teacher_logprobs = tokens, [version] * len(tokens), teacher
    item.logprobs = None  # type: ignore[assignment]  # unknown: the audit refuses an is_method that needs them
    at_cap = len(tokens) >= max_tokens
    item.finish_reason = "horizon" if at_cap and (not tokens or tokens[-1] not in eos_ids) else "eos"
    return item
