"""The built-in task: chained single-digit arithmetic written out step by step.

A prompt fixes a start value ``x``, two operands ``a`` and ``b`` and a step count ``n``. The response
applies one rule ``n`` times, one line per step, counting down, then states the answer::

    prompt:   muladd x=4 a=3 b=5 n=3\\n
    response: 03:4*3=2+5=7\\n02:7*3=1+5=6\\n01:6*3=8+5=3\\nans=3

Two sub-tasks (``route``) use different operators, so multi-teacher routing has something to route:

* ``muladd``: ``x <- (x*a + b) mod 10``, line ``kk:x*a=p+b=q``
* ``submul``: ``x <- (x - a)*b mod 10``, line ``kk:x-a=p*b=q``

Why this shape:

* the same skill repeats along the response (every line is the same two table look-ups on values
  found exactly one line back), so learning on response prefixes transfers to later positions;
* the multiplier is a unit mod 10 (1, 3, 7, 9), so every step is a bijection on digits: a wrong
  digit early changes every later value and the final answer (student drift);
* the counter counts down to ``01``, so the stop decision is local and the length is set by ``n``;
* every line has the same length (:data:`LINE_CHARS` characters), so with a character-level
  tokenizer the response has ``n * LINE_CHARS + len("ans=d")`` tokens before EOS.

``train`` and ``eval`` problems are disjoint by construction: a problem belongs to ``eval`` iff a
stable hash of its parameters falls in the eval bucket (about one problem in :data:`EVAL_BUCKETS`).
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

ROUTES: tuple[str, ...] = ("muladd", "submul")
# Arithmetic mod 10 (one digit per value). MOD = 5 was tried to shrink the digit tables (25 entries
# instead of 100) and trained no faster on CPU, so digits stay decimal.
MOD = 10
UNITS: tuple[int, ...] = (1, 3, 7, 9)  # invertible mod 10: keeps each step a bijection
MIN_STEPS = 2
MAX_STEPS = 24
LINE_CHARS = 13  # "kk:x*a=p+b=q\n"
ANSWER_PREFIX = "ans="
# Longest response: MAX_STEPS lines + "ans=d" + <eos> = 318 tokens; the trainer's horizon.
MAX_RESPONSE_TOKENS = 320
DEFAULT_CANDIDATES: tuple[int, ...] = (32, 64, 128, 192, 256)  # prefix windows, in tokens
SHORT_STEPS = 10  # n <= SHORT_STEPS is drawn SHORT_WEIGHT times as often as a longer n
SHORT_WEIGHT = 3
EVAL_BUCKETS = 8  # one problem in EVAL_BUCKETS is held out for eval
SPLITS = ("train", "eval")

# the two operators of each route's line ``kk:x<op1>a=p<op2>b=q``
OPERATORS: dict[str, tuple[str, str]] = {"muladd": ("*", "+"), "submul": ("-", "*")}


def first_op(route: str, x: int, a: int) -> int:
    """The intermediate ``p`` of a line from the value ``x`` and the first operand."""
    return (x * a) % MOD if route == "muladd" else (x - a) % MOD


def second_op(route: str, p: int, b: int) -> int:
    """The line's result ``q`` from the intermediate ``p`` and the second operand."""
    return (p + b) % MOD if route == "muladd" else (p * b) % MOD


_PROMPT_RE = re.compile(r"^(muladd|submul) x=(\d) a=(\d) b=(\d) n=(\d+)\n$")
_ANSWER_RE = re.compile(re.escape(ANSWER_PREFIX) + r"(\d+)")
_LINE_RE = re.compile(r"^(\d+):(\d)([*\-])(\d)=(\d)([+*])(\d)=(\d)$")


@dataclass(frozen=True)
class TaskSample:
    """One prompt as the trainer sees it."""

    id: str
    prompt: str  # text fed to the model; the tokenizer's post-processor prepends <bos>
    answer: str  # the final answer string (one digit)
    route: str  # teacher routing key: the sub-task name, one of ROUTES


@dataclass(frozen=True)
class Problem:
    route: str
    x: int
    a: int
    b: int
    n: int

    # the line format's counter width and the allowed step counts; the long tasks widen them (adwin.tasks.long)
    COUNTER_DIGITS: ClassVar[int] = 2
    MIN_N: ClassVar[int] = MIN_STEPS
    MAX_N: ClassVar[int] = MAX_STEPS

    def __post_init__(self) -> None:
        if self.route not in ROUTES:
            raise ValueError(f"unknown route {self.route!r}; expected one of {ROUTES}")
        if not (0 <= self.x < MOD and 0 <= self.a < MOD and 0 <= self.b < MOD):
            raise ValueError(f"x, a, b must be digits below {MOD}")
        if not self.MIN_N <= self.n <= self.MAX_N:
            raise ValueError(f"n must be in [{self.MIN_N}, {self.MAX_N}], got {self.n}")
        multiplier = self.a if self.route == "muladd" else self.b
        if multiplier not in UNITS:
            raise ValueError(f"the multiplier of {self.route} must be one of {UNITS}")

    @property
    def prompt(self) -> str:
        return f"{self.route} x={self.x} a={self.a} b={self.b} n={self.n}\n"

    @property
    def key(self) -> str:
        return f"{self.route}:{self.x}:{self.a}:{self.b}:{self.n}"

    def step(self, x: int) -> tuple[int, int]:
        """One application of the rule: (intermediate p, new x)."""
        p = first_op(self.route, x, self.a)
        return p, second_op(self.route, p, self.b)

    def counter_text(self, counter: int) -> str:
        return f"{counter:0{self.COUNTER_DIGITS}d}"

    @classmethod
    def line_chars(cls) -> int:
        """Characters (= tokens) of every line: the counter, ``:x*a=p+b=q`` and the newline."""
        return cls.COUNTER_DIGITS + LINE_CHARS - 2

    def line(self, counter: int, x: int) -> tuple[str, int]:
        p, q = self.step(x)
        op1, op2 = OPERATORS[self.route]
        return f"{self.counter_text(counter)}:{x}{op1}{self.a}={p}{op2}{self.b}={q}\n", q

    def solution(self, first_x: int | None = None) -> str:
        """The full written response (without EOS). ``first_x`` overrides the value the first line
        starts from, to show how an early mistake propagates."""
        x = self.x if first_x is None else first_x
        lines = []
        for counter in range(self.n, 0, -1):
            text, x = self.line(counter, x)
            lines.append(text)
        return "".join(lines) + f"{ANSWER_PREFIX}{x}"

    @property
    def answer(self) -> str:
        x = self.x
        for _ in range(self.n):
            x = self.step(x)[1]
        return str(x)

    @property
    def split(self) -> str:
        digest = hashlib.sha256(self.key.encode()).digest()
        return "eval" if digest[0] % EVAL_BUCKETS == 0 else "train"

    def sample(self, sample_id: str) -> TaskSample:
        return TaskSample(id=sample_id, prompt=self.prompt, answer=self.answer, route=self.route)


def all_problems() -> list[Problem]:
    """Every problem of the task (2 routes x 10 x 40 x 23 = 18,400), in a fixed order."""
    out = []
    for route in ROUTES:
        for x in range(MOD):
            for a in range(MOD):
                for b in range(MOD):
                    for n in range(MIN_STEPS, MAX_STEPS + 1):
                        multiplier = a if route == "muladd" else b
                        if multiplier in UNITS:
                            out.append(Problem(route, x, a, b, n))
    return out


_SPLIT_CACHE: dict[str, list[Problem]] = {}


def split_problems(split: str) -> list[Problem]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split not in _SPLIT_CACHE:
        for name in SPLITS:
            _SPLIT_CACHE[name] = []
        for problem in all_problems():
            _SPLIT_CACHE[problem.split].append(problem)
    return _SPLIT_CACHE[split]


def step_count_weights() -> dict[int, int]:
    """Relative frequency of each step count. Short chains are drawn more often: this keeps the
    median response near 110 tokens (cheap to train on CPU) while chains of up to MAX_STEPS steps
    (318 tokens) still occur, so every candidate window up to 256 is a real choice."""
    return {n: SHORT_WEIGHT if n <= SHORT_STEPS else 1 for n in range(MIN_STEPS, MAX_STEPS + 1)}


_POOL_CACHE: dict[str, dict[tuple[str, int], list[Problem]]] = {}


def iter_problems(seed: int, split: str = "train") -> Iterator[Problem]:
    """The endless sequence of problems drawn with replacement from ``split``: routes alternate (balanced
    batches), the step count follows :func:`step_count_weights`, the rest is uniform. Deterministic in
    (seed, split); every prefix is the same whatever length is read, so a longer run sees the shorter
    run's problems first."""
    if split not in _POOL_CACHE:
        pools: dict[tuple[str, int], list[Problem]] = {}
        for p in split_problems(split):
            pools.setdefault((p.route, p.n), []).append(p)
        _POOL_CACHE[split] = pools
    pools = _POOL_CACHE[split]
    weights = step_count_weights()
    counts, freq = list(weights), list(weights.values())
    rng = random.Random(f"adwin-chain:{split}:{seed}")
    for i in itertools.count():
        route = ROUTES[i % len(ROUTES)]
        steps = rng.choices(counts, weights=freq)[0]
        yield rng.choice(pools[(route, steps)])


def generate_problems(n: int, seed: int, split: str = "train") -> list[Problem]:
    """The first ``n`` problems of :func:`iter_problems`."""
    return list(itertools.islice(iter_problems(seed, split), n))


def iter_samples(seed: int, split: str = "train") -> Iterator[TaskSample]:
    """:func:`iter_problems` as task samples; sample ``i`` has id ``{split}-{seed}-{i}``."""
    return (p.sample(f"{split}-{seed}-{i}") for i, p in enumerate(iter_problems(seed, split)))


def generate_samples(n: int, seed: int, split: str = "train") -> list[TaskSample]:
    """``n`` task samples from ``split`` ("train" or "eval", disjoint), deterministic in the seed."""
    return list(itertools.islice(iter_samples(seed, split), n))


def parse_prompt(prompt: str, kind: type[Problem] = Problem) -> Problem:
    """The problem a prompt states (inverse of :attr:`Problem.prompt`), as a ``kind`` (the task's line format)."""
    m = _PROMPT_RE.match(prompt)
    if m is None:
        raise ValueError(f"not a task prompt: {prompt!r}")
    return kind(m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4)), int(m.group(5)))


def solution_for(sample: TaskSample) -> str:
    """The reference written response of a sample (without EOS)."""
    return parse_prompt(sample.prompt).solution()


def extract_answer(response_text: str) -> str | None:
    """The first stated final answer in a response, or None when there is none."""
    m = _ANSWER_RE.search(response_text)
    return m.group(1) if m else None


def check_answer(response_text: str, answer: str) -> bool:
    """True iff the response states the right final answer: the first ``ans=<digits>`` equals
    ``answer``. Special tokens are ignored; only the first statement counts, so a response cannot
    win by listing several answers."""
    for special in ("<bos>", "<eos>", "<pad>"):
        response_text = response_text.replace(special, "")
    got = extract_answer(response_text)
    return got is not None and got == answer.strip()


def written_lines(text: str) -> list[str]:
    """The lines of a response that end in a newline, without it: a line cut off by the horizon or the EOS is
    not written yet."""
    return text.split("\n")[:-1]


def lines_right(reference: str, response_text: str, n_lines: int) -> int:
    """How many of the reference's first ``n_lines`` lines the response writes right, character for character,
    before its first wrong or missing line. Under drift every line after a wrong one is computed from a wrong
    value, so the run of right lines from the start is what a student's line skill carries."""
    right = 0
    for want, got in zip(written_lines(reference + "\n")[:n_lines], written_lines(response_text), strict=False):
        if want != got:
            break
        right += 1
    return right


def verify_solution(prompt: str, response_text: str, kind: type[Problem] = Problem) -> bool:
    """True iff every written line follows from the previous one (the first from the prompt), the
    counter counts down to 01 and the stated answer is the last value. Used to audit solutions;
    ``kind`` is the task's line format."""
    problem = parse_prompt(prompt, kind)
    body, sep, tail = response_text.rpartition(ANSWER_PREFIX)
    if not sep:
        return False
    lines = body.split("\n")
    if lines[-1] != "" or len(lines) - 1 != problem.n:
        return False
    x = problem.x
    for i, line in enumerate(lines[:-1]):
        m = _LINE_RE.match(line)
        if m is None or int(m.group(1)) != problem.n - i or int(m.group(2)) != x:
            return False
        expected, x = problem.line(problem.n - i, x)
        if line + "\n" != expected:
            return False
    return tail == str(x)
