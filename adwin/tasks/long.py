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
# SFT curriculum: chains of MIN_STEPS..SFT_SHORT_MAX lines are drawn SFT_SHORT_SHARE of the time
SFT_SHORT_MAX = LONG_MIN_STEPS - 1
SFT_SHORT_SHARE = 0.85
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


def _draw(rng: random.Random, route: str, n: int) -> LongProblem:
    x, a, b = rng.randrange(MOD), rng.randrange(MOD), rng.randrange(MOD)
    unit = rng.choice(UNITS)  # the multiplier must be a unit mod 10: every step a bijection
    a, b = (unit, b) if route == "muladd" else (a, unit)
    return LongProblem(route, x, a, b, n)


def _stream(tag: str, seed: int, split: str, draw_n: Callable[[random.Random], int]) -> Iterator[Problem]:
    rng = random.Random(f"adwin-{tag}:{split}:{seed}")
    for i in itertools.count():
        route = ROUTES[i % len(ROUTES)]  # routes alternate: balanced batches
        while True:  # rejection keeps the split's hash rule (1 problem in EVAL_BUCKETS is eval)
            problem = _draw(rng, route, draw_n(rng))
            if problem.split == split:
                yield problem
                break


def iter_long_problems(seed: int, split: str = "train") -> Iterator[Problem]:
    """The task problems of ``split``: 36-145 lines, uniform; deterministic in (seed, split), and every
    prefix is the same whatever length is read."""
    return _stream("chain-long", seed, split, lambda rng: rng.randint(LONG_MIN_STEPS, LONG_MAX_STEPS))


def iter_sft_problems(seed: int, split: str = "train") -> Iterator[Problem]:
    """The SFT curriculum: short chains (2-35 lines) :data:`SFT_SHORT_SHARE` of the time, else task-length ones."""

    def steps(rng: random.Random) -> int:
        if rng.random() < SFT_SHORT_SHARE:
            return rng.randint(MIN_STEPS, SFT_SHORT_MAX)
        return rng.randint(LONG_MIN_STEPS, LONG_MAX_STEPS)

    return _stream("chain-long-sft", seed, split, steps)


# what shapes the long tasks' data beyond the chain's constants (adwin.tasks.assets.profile_fingerprint)
FORMAT_FIELDS: tuple[object, ...] = ("prompt-n-zero-padded", LongProblem.COUNTER_DIGITS, LONG_MIN_STEPS, LONG_MAX_STEPS,
                                     SFT_SHORT_MAX, SFT_SHORT_SHARE, SFT_GROUP_ALL)
