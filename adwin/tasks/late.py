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

Why the student lacks it: the student initialisation is the early SFT snapshot, and before that
snapshot every closing character (and the EOS) is masked out of the loss (label -100; see
:func:`write_late`, ``train_closing=False``). The teacher's later SFT steps train on the whole
response. The chain lines are trained from step 0 as in ``chain``, so the student is strong on the
early phase and has no skill at all on the late one (``adwin/tasks/phases.py`` measures both).
"""

from __future__ import annotations

import random
import re

from adwin.tasks.chain import ANSWER_PREFIX, MOD, Problem, parse_prompt
from adwin.tasks.noise import corrupt_solution

CLOSING_PREFIX = "fin:"
# The closing line adds 10 tokens; a 24-line chain would need 328 tokens, over the 320-token horizon
# (MAX_RESPONSE_TOKENS), so chain-late skips chains of 24 lines: at most 23 x 13 + 10 + 5 + <eos> = 315.
CLOSING_STEPS_LEFT_OUT = 1
_CLOSING_RE = re.compile(r"^fin:(\d)\+(\d)=(\d)$")
_LINE = re.compile(r"^\d\d:(\d)\D.*=(\d)$")  # a chain line as written: its input x and its result q


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
    masks the closing phase (the student's SFT steps)."""
    text, trained = corrupt_solution(problem, rng, line_rate)
    body, _, _ = text.rpartition(ANSWER_PREFIX)
    trained = trained[: len(body)]
    last = _LINE.match(body.split("\n")[-2])
    assert last is not None, "a chain line always matches"
    closing, total = closing_line(int(last.group(1)), int(last.group(2)))
    tail = closing + f"{ANSWER_PREFIX}{total}"
    return body + tail, trained + [train_closing] * len(tail)


def verify_late_solution(prompt: str, response_text: str) -> bool:
    """True iff every chain line follows the rule, the closing line adds the last line's input and
    result and the stated answer is its value."""
    problem = parse_prompt(prompt)
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
