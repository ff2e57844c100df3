"""``chain-late``: the chain task plus a closing phase that the student initialisation never learned.

The response writes the ``n`` chain lines of :mod:`adwin.tasks.chain`, then one closing line that
combines two values written earlier, and states its result as the answer::

    prompt:   muladd x=4 a=3 b=5 n=3\\n
    response: 03:4*3=2+5=7\\n02:7*3=1+5=6\\n01:6*3=8+5=3\\nfin:6+3=9\\nans=9

``fin:A+B=S`` adds the last line's input ``A`` (the value it starts from: the previous line's result,
or the prompt's ``x`` for a one-line chain) and its result ``B``, mod 10. The skill sits at the end of
the response (13 n tokens in: 13 to 299), so a prefix window shorter than the response never sees it,
and the answer depends on it. Both values sit in the line just above, so the skill is local, like the
chain's own steps: a first version added the *first* line's result, up to 300 tokens back, and the
266k-parameter teacher learned it only half the time (docs/task.md).

Why the student lacks it: the student initialisation is an early SFT snapshot, and before that
snapshot the closing line is written with random digits (``A``, ``B``, ``S`` and the answer), which
are masked out of the loss (label -100; see :func:`write_late`, ``train_closing=False``), while its
format (``fin:``, ``+``, ``=``, ``ans=``, the EOS) is trained: the student writes a closing line and
stops, with values it never saw computed. The teacher's later SFT steps train on the whole response. The chain lines
are trained from step 0 as in ``chain``, so the student is strong on the early phase and weak on
the late one (``adwin/tasks/phases.py`` measures both; docs/task.md has the numbers). Version 2 of
the task masked the whole closing phase and the EOS: its student never stopped, so every rollout ran
to the horizon and no method learned the closing within a run (docs/benchmarks.md).
"""

from __future__ import annotations

import random
import re

from adwin.tasks.chain import ANSWER_PREFIX, MOD, Problem, parse_prompt, written_lines
from adwin.tasks.noise import corrupt_solution

CLOSING_PREFIX = "fin:"
# The closing line adds 10 tokens; a 24-line chain would need 328 tokens, over the 320-token horizon
# (MAX_RESPONSE_TOKENS), so chain-late skips chains of 24 lines: at most 23 x 13 + 10 + 5 + <eos> = 315.
CLOSING_STEPS_LEFT_OUT = 1
_CLOSING_RE = re.compile(r"^fin:(\d)\+(\d)=(\d)$")
_LINE = re.compile(r"^\d+:(\d)\D.*=(\d)$")  # a chain line as written: its input x and its result q


def closing_line(start: int, result: int) -> tuple[str, int]:
    """The closing line (with its newline) from the last line's input and result, and its value."""
    total = (start + result) % MOD
    return f"{CLOSING_PREFIX}{start}+{result}={total}\n", total


def _last_line(problem: Problem) -> tuple[int, int]:
    """The last chain line's input and result."""
    x = problem.x
    for _ in range(problem.n - 1):
        x = problem.step(x)[1]
    return x, problem.step(x)[1]


def late_answer(problem: Problem) -> str:
    return str(closing_line(*_last_line(problem))[1])


def late_solution(problem: Problem) -> str:
    """The full written response (without EOS)."""
    text, _ = write_late(problem, random.Random(0), 0.0)
    return text


def write_late(
    problem: Problem, rng: random.Random, line_rate: float, train_closing: bool = True
) -> tuple[str, list[bool]]:
    """A written response (without EOS) and, per character, whether it is trained on. The chain
    lines may carry planted mistakes (:func:`adwin.tasks.noise.corrupt_solution`); the closing line
    combines the values as *written*, like every later field after a mistake. ``train_closing=False``
    (the student's SFT steps) writes the closing format with random digits, masks the digits and trains
    the format and the EOS: the flags then have one entry more than the text, the EOS's
    (``adwin.tasks.sft.encode_example``)."""
    text, trained = corrupt_solution(problem, rng, line_rate)
    body, _, _ = text.rpartition(ANSWER_PREFIX)
    trained = trained[: len(body)]
    last = _LINE.match(body.split("\n")[-2])
    assert last is not None, "a chain line always matches"
    closing, total = closing_line(int(last.group(1)), int(last.group(2)))
    tail = closing + f"{ANSWER_PREFIX}{total}"
    if train_closing:
        return body + tail, trained + [True] * len(tail)
    # the student phase: the closing format with digits drawn independently of the rule (seeded by the
    # prompt), masked, so not one student weight depends on the rule, even through the context
    digits = random.Random(problem.prompt)
    a, b, s = (digits.randrange(MOD) for _ in range(3))
    tail = f"{CLOSING_PREFIX}{a}+{b}={s}\n{ANSWER_PREFIX}{digits.randrange(MOD)}"
    return body + tail, trained + [not c.isdigit() for c in tail] + [True]


def closing_right(response_text: str) -> bool:
    """True iff the response's first closing line adds the input and result of the chain line written just above
    it (as written, right or wrong: the closing skill apart from the chain's) and ends in a newline."""
    lines = written_lines(response_text)
    for i, line in enumerate(lines):
        if line.startswith(CLOSING_PREFIX):
            last = _LINE.match(lines[i - 1]) if i > 0 else None
            return last is not None and line + "\n" == closing_line(int(last.group(1)), int(last.group(2)))[0]
    return False


def verify_late_solution(prompt: str, response_text: str, kind: type[Problem] = Problem) -> bool:
    """True iff every chain line follows the rule, the closing line adds the last line's input and
    result and the stated answer is its value; ``kind`` is the task's line format."""
    problem = parse_prompt(prompt, kind)
    body, sep, tail = response_text.rpartition(ANSWER_PREFIX)
    if not sep:
        return False
    lines = body.split("\n")
    if len(lines) != problem.n + 2 or lines[-1] != "":
        return False
    x = start = problem.x
    for i, line in enumerate(lines[: problem.n]):
        start = x
        expected, x = problem.line(problem.n - i, x)
        if line + "\n" != expected:
            return False
    m = _CLOSING_RE.match(lines[problem.n])
    if m is None or (int(m.group(1)), int(m.group(2))) != (start, x):
        return False
    return int(m.group(3)) == (start + x) % MOD and tail == m.group(3)
