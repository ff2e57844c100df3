"""The long-horizon regime: the chain tasks with responses of 510-2,046 tokens (horizon 2,048).

``chain-long`` is :mod:`adwin.tasks.chain` at length and ``chain-late-long`` is :mod:`adwin.tasks.late`
at length (registered in :mod:`adwin.tasks.suite`). The rule, the operators and the closing line are
theirs; what changes is the counter, three digits wide, so that a chain may run to 145 lines, and ``n``
in the prompt, zero-padded to the same three digits::

    prompt:   muladd x=4 a=3 b=5 n=040\\n
    response: 040:4*3=2+5=7\\n039:7*3=1+5=6\\n ... 001:...=q\\nans=q

Every line is 14 characters (= tokens); a task problem has 36-145 lines, so a ``chain-long`` response
has 14 n + 6 tokens with its EOS (510-2,036) and a ``chain-late-long`` one 10 more (520-2,046).

Why this shape:

* ``n`` is written with three digits whatever its value, so every long prompt has the same length and
  the first line's counter is a copy from a fixed position, as in ``chain`` (with ``n=40`` beside
  ``n=138`` the copy moved by one character and the first line was wrong for three-digit ``n``);
* the skill stays strictly local: every field of a line is a copy or a table look-up of the line
  just above it (the counter a decrement of the one above), and the stop after ``001`` is local, so
  nothing needs an absolute position and what a model learns on short chains holds on long ones;
* hence the SFT curriculum (:func:`iter_sft_problems`): most training chains are short (2-35
  lines: cheap steps), a minority are task-length, which teaches the positions up to 2,048 and the
  counter's hundreds digit; SFT cost is tokens, and a line costs the same 14 tokens in either;
* the paper's regime: at a per-line error rate the accuracy of an ``n``-line chain is that rate's
  complement to the power ``n``, so a student that is good on short chains is weak at length (drift),
  while the teacher must be near-perfect per line.

Train and eval problems are disjoint: the split is :attr:`adwin.tasks.chain.Problem.split`'s hash.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

from adwin.tasks.chain import MIN_STEPS, MOD, ROUTES, UNITS, Problem

LONG_MIN_STEPS = 36  # 36 lines = 510 response tokens with the EOS
LONG_MAX_STEPS = 145  # chain-late-long: 145 x 14 + 10 + 5 + <eos> = 2,046 <= the horizon
LONG_MAX_RESPONSE_TOKENS = 2048  # the trainer's horizon (rollout.max_response_len of configs/long.yaml)
LONG_CANDIDATES: tuple[int, ...] = (64, 128, 256, 512, 1024)  # the paper's ladder, scaled to the horizon
# SFT curriculum: chains of MIN_STEPS..SFT_SHORT_MAX lines are drawn SFT_SHORT_SHARE of the time, excerpts (the
# first MIN_STEPS..SFT_SHORT_MAX lines of a task-length chain) SFT_EXCERPT_SHARE, task-length chains the rest
SFT_SHORT_MAX = LONG_MIN_STEPS - 1
SFT_SHORT_SHARE = 0.40
SFT_EXCERPT_SHARE = 0.45
# SFT batches grouped by length over a whole training segment (adwin.tasks.sft.make_batches): with 85 % short
# chains, grouping within 8 batches still padded short chains to task length (11,234 tokens per padded batch)
SFT_GROUP_ALL = True


@dataclass(frozen=True)
class LongProblem(Problem):
    """A chain written with a three-digit counter. Short step counts are valid too: the SFT curriculum
    trains on them in the long format (task problems have :data:`LONG_MIN_STEPS` lines or more)."""

    COUNTER_DIGITS: ClassVar[int] = 3
    MIN_N: ClassVar[int] = MIN_STEPS
    MAX_N: ClassVar[int] = LONG_MAX_STEPS

    @property
    def prompt(self) -> str:
        return f"{self.route} x={self.x} a={self.a} b={self.b} n={self.counter_text(self.n)}\n"


@dataclass(frozen=True)
class LongExcerpt(LongProblem):
    """An SFT example that is the first ``kept`` lines of a task-length chain: no answer, and its EOS is not
    trained (the task's writers cut it, :func:`adwin.tasks.suite.excerpted`). Its counters are the long
    chain's, so it teaches the decrement's borrow at every tens and hundreds digit at a short chain's cost;
    its split is the whole chain's (``key`` has no ``kept``)."""

    kept: int = LONG_MIN_STEPS

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.kept < self.n:
            raise ValueError(f"an excerpt keeps 1..n-1 lines, got {self.kept} of {self.n}")


def _draw(rng: random.Random, route: str, n: int, kept: int | None = None) -> LongProblem:
    x, a, b = rng.randrange(MOD), rng.randrange(MOD), rng.randrange(MOD)
    unit = rng.choice(UNITS)  # the multiplier must be a unit mod 10: every step a bijection
    a, b = (unit, b) if route == "muladd" else (a, unit)
    return LongProblem(route, x, a, b, n) if kept is None else LongExcerpt(route, x, a, b, n, kept)


# rng -> (the chain's step count, the lines an excerpt keeps or None for a whole chain)
Shape = Callable[[random.Random], tuple[int, int | None]]


def _stream(tag: str, seed: int, split: str, shape: Shape) -> Iterator[Problem]:
    rng = random.Random(f"adwin-{tag}:{split}:{seed}")
    for i in itertools.count():
        route = ROUTES[i % len(ROUTES)]  # routes alternate: balanced batches
        while True:  # rejection keeps the split's hash rule (1 problem in EVAL_BUCKETS is eval)
            problem = _draw(rng, route, *shape(rng))
            if problem.split == split:
                yield problem
                break


def iter_long_problems(seed: int, split: str = "train") -> Iterator[Problem]:
    """The task problems of ``split``: 36-145 lines, uniform; deterministic in (seed, split), and every
    prefix is the same whatever length is read."""
    return _stream("chain-long", seed, split, lambda rng: (rng.randint(LONG_MIN_STEPS, LONG_MAX_STEPS), None))


def iter_sft_problems(seed: int, split: str = "train") -> Iterator[Problem]:
    """The SFT curriculum: short chains (2-35 lines) :data:`SFT_SHORT_SHARE` of the time, excerpts of 2-35 lines
    of task-length chains :data:`SFT_EXCERPT_SHARE`, else whole task-length chains."""

    def shape(rng: random.Random) -> tuple[int, int | None]:
        draw = rng.random()
        if draw < SFT_SHORT_SHARE:
            return rng.randint(MIN_STEPS, SFT_SHORT_MAX), None
        n = rng.randint(LONG_MIN_STEPS, LONG_MAX_STEPS)
        return n, (rng.randint(MIN_STEPS, SFT_SHORT_MAX) if draw < SFT_SHORT_SHARE + SFT_EXCERPT_SHARE else None)

    return _stream("chain-long-sft", seed, split, shape)


# what shapes the long tasks' data beyond the chain's constants (adwin.tasks.assets.profile_fingerprint)
FORMAT_FIELDS: tuple[object, ...] = ("prompt-n-zero-padded", LongProblem.COUNTER_DIGITS, LONG_MIN_STEPS, LONG_MAX_STEPS,
                                     SFT_SHORT_MAX, SFT_SHORT_SHARE, SFT_GROUP_ALL, "excerpts", SFT_EXCERPT_SHARE)
