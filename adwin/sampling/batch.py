"""A step's rollouts (``Batch``) and the one call that makes them: prompts encoded, the engine's ``generate`` (probe
rows that ride the call included, ``Rider``), rows laid out. The trainer's ``adwin.loop.sampler.Sampler`` enters
this room once per rollout or evaluation call; everything the call does between the prompt texts and the scored
rows happens here and below (``adwin.decode``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from adwin.decode.engine import HFEngine, RolloutEngine, VLLMEngine
from adwin.decode.loop import Generation
from adwin.decode.static_cache import CompileSetting
from adwin.sampling.compact import generate_compacting
from adwin.sampling.data import Prompt
from adwin.sampling.rollout import Rows, encode_prompts, eos_ids, layout, pad_id_of

Backend = Literal["hf", "vllm"]


@dataclass
class Batch:
    """One step's rollouts: ragged per-sample lists plus their right-padded rows."""

    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    finished: list[bool]
    rows: Rows
    # log p(token) under the sampling weights, one per response token; recorded only when the loss weights
    # tokens by the old-to-current ratio (loss.is_method, the PPO clip): generation and training forward
    # differ numerically (kernels, padding, dtype), which those treatments correct
    behavior_logprobs: list[list[float]] | None = None
    decode_steps: int = 0  # token positions the rollout call decoded (riding probe rows included)


class Rider(Protocol):
    """Probe rows that ride a training rollout call (``adwin.probes.riding.RidingWorker``)."""

    def board(self, window: int) -> tuple[list[list[int]], list[int], list[int] | None] | None:
        """Contexts, token budgets (at most the call's ``window``) and row seeds (None: batch RNG) to add to this
        call; None: nothing to add."""
        ...

    def land(self, g: Generation, rows: int, seconds: float, added_steps: int) -> None:
        """The boarded rows' part of the call's result (``rows``: the call's rows in all; ``seconds``: its wall;
        ``added_steps``: decode steps the call took beyond what its rollout rows needed)."""
        ...


@dataclass(frozen=True)
class Draw:
    """How one call samples: ``temperature``/``top_p``, whether behavior logprobs are recorded (``record``), and
    ``seeds``: one per row (``rollout.seeding: per_sample``), else None (HF's batch RNG)."""

    temperature: float
    top_p: float
    record: bool = False
    seeds: list[int] | None = None


@dataclass(frozen=True)
class Student:
    """The student as the sampling calls need it: its tokenizer, prompt cut, EOS ids and pad id."""

    tokenizer: object
    max_prompt_len: int
    eos: set[int]
    pad: int


def open_student(model: torch.nn.Module, tokenizer: object, max_prompt_len: int, backend: Backend | None, *,
                 compile: CompileSetting, dtype: str, seed: int, gpu_memory: float,
                 max_model_len: int) -> tuple[Student, RolloutEngine | None]:
    """The student's tokens (EOS, pad) and its engine: ``hf``: transformers on the trainer's module; ``vllm``: a vLLM
    engine on the student's checkpoint (folder or hub id; lazily imported: no vLLM or no CUDA fails here naming
    ``rollout.backend``); None: no engine (the caller brings its own)."""
    eos = eos_ids(model, tokenizer)
    student = Student(tokenizer, max_prompt_len, eos, pad_id_of(tokenizer, eos))
    if backend is None:
        return student, None
    if backend == "hf":
        return student, HFEngine(model, eos, student.pad, compile=compile)
    path = str(getattr(model, "name_or_path", "") or "")
    if not path:  # the engine is built from a checkpoint (then synced with the trainer's weights before use)
        raise ValueError("rollout.backend: 'vllm' loads the student from its checkpoint (a folder or hub id); this "
                         "student was not loaded with from_pretrained (no name_or_path): set rollout.backend=hf")
    return student, VLLMEngine.load(path, eos, dtype=dtype, seed=seed, gpu_memory_utilization=gpu_memory,
                                    max_model_len=max_model_len)


def roll_out(engine: RolloutEngine, student: Student, prompts: list[Prompt], n: int, window: int, draw: Draw,
             rider: Rider | None = None) -> Batch:
    """``n`` samples per prompt, at most ``window`` tokens each, then right-padded rows for scoring; the probe rows
    ``rider`` boards ride the same engine call (their own budgets and seeds)."""
    rep = [p for p in prompts for _ in range(n)]
    ctx = encode_prompts(student.tokenizer, [p.prompt for p in rep], student.max_prompt_len)
    ride = rider.board(window) if rider is not None else None
    if ride is None:
        g = engine.generate(ctx, [window] * len(ctx), temperature=draw.temperature, top_p=draw.top_p,
                            with_logprobs=draw.record, row_seeds=draw.seeds)
    else:
        assert rider is not None
        g = _ride(engine, ctx, window, ride, draw, rider)
    return Batch(rep, ctx, g.response_ids, g.finished, layout(ctx, g.response_ids, student.pad), g.logprobs,
                 g.decode_steps)


def _ride(engine: RolloutEngine, ctx: list[list[int]], window: int,
          ride: tuple[list[list[int]], list[int], list[int] | None], draw: Draw, rider: Rider) -> Generation:
    """One engine call over the rollout rows then the boarded probe rows (their budgets within ``window``); the
    probe part lands on the rider, with the decode steps the call took beyond what the rollout rows needed."""
    contexts, budgets, probe_seeds = ride
    seeds = draw.seeds
    if (seeds is None) != (probe_seeds is None):
        raise ValueError("rollout rows and riding probe rows must both be seeded per sample or both not")
    k = len(ctx)
    t0 = time.perf_counter()
    g = engine.generate(ctx + contexts, [window] * k + budgets, temperature=draw.temperature, top_p=draw.top_p,
                        with_logprobs=True, row_seeds=None if seeds is None else seeds + probe_seeds)  # type: ignore[operator]
    seconds = time.perf_counter() - t0
    lp = g.logprobs or [[] for _ in g.response_ids]
    mine = Generation(g.response_ids[:k], g.finished[:k], lp[:k] if draw.record else None, g.decode_steps)
    rider.land(Generation(g.response_ids[k:], g.finished[k:], lp[k:], g.decode_steps), k + len(contexts),
               seconds, max(0, g.decode_steps - steps_needed(mine, window)))
    return mine


def steps_needed(g: Generation, window: int) -> int:
    """Decode steps rows that all had the budget ``window`` needed: batched decoding stops once every row emitted
    EOS, so ``window`` unless each of them ended before it, then its longest row."""
    return window if not all(g.finished) else max(map(len, g.response_ids), default=0)


def evaluation_rows(engine: RolloutEngine, student: Student, prompts: Sequence[Prompt], budget: int, draw: Draw, *,
                    chunk: int, compact: bool) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """Prompt ids, responses and the order to score them in, for held-out problems: ``chunk`` rows per call, at
    most ``budget`` tokens each. ``compact`` on the transformers engine drops stopped rows from the batch
    (``adwin.sampling.compact``) and orders rows by length (far less padding when scored); otherwise one engine call
    per chunk (vLLM batches continuously itself), scored in that order."""
    ctx = encode_prompts(student.tokenizer, [p.prompt for p in prompts], student.max_prompt_len)
    seeds = draw.seeds
    responses: list[list[int]] = []
    for i in range(0, len(ctx), chunk):
        row_seeds = None if seeds is None else seeds[i : i + chunk]
        if compact and isinstance(engine, HFEngine):
            g = generate_compacting(engine.model, ctx[i : i + chunk], budget, eos=student.eos, pad_id=student.pad,
                                    temperature=draw.temperature, top_p=draw.top_p, row_seeds=row_seeds,
                                    compile=engine.compile)
        else:
            g = engine.generate(ctx[i : i + chunk], [budget] * len(ctx[i : i + chunk]), temperature=draw.temperature,
                                top_p=draw.top_p, with_logprobs=False, row_seeds=row_seeds)
        responses += g.response_ids
    if compact and isinstance(engine, HFEngine):  # score rows of similar length together
        return ctx, responses, sorted(range(len(ctx)), key=lambda b: len(ctx[b]) + len(responses[b]))
    return ctx, responses, list(range(len(ctx)))
