"""``chain-late``: the chain task plus a closing phase that the student initialisation never learned.

The response writes the ``n`` chain lines of :mod:`adwin.tasks.chain`, then one closing line that
combines two values written earlier, and states its result as the answer::

    prompt:   muladd x=4 a=3 b=5 n=3\\n
    response: 03:4*3=2+5=7\\n02:7*3=1+5=6\\n01:6*3=8+5=3\\nfin:7+3=0\\nans=0

``fin:A+B=S`` adds the first line's result ``A`` (13 tokens into the response) and the last line's
result ``B`` mod 10. The skill sits at the end of the response (13 n + 1 tokens in: 27 to 313), so a
prefix window shorter than the response never sees it, and the answer depends on it.

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
_LINE_Q = re.compile(r"=(\d)$")


def closing_line(first: int, last: int) -> tuple[str, int]:
    """The closing line (with its newline) from the first and last line results, and its value."""
    total = (first + last) % MOD
    return f"{CLOSING_PREFIX}{first}+{last}={total}\n", total


def _line_results(problem: Problem) -> list[int]:
    x, out = problem.x, []
    for _ in range(problem.n):
        x = problem.step(x)[1]
        out.append(x)
    return out


def late_answer(problem: Problem) -> str:
    results = _line_results(problem)
    return str(closing_line(results[0], results[-1])[1])


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
    written = [int(_LINE_Q.search(line).group(1)) for line in body.split("\n")[:-1]]  # type: ignore[union-attr]
    closing, total = closing_line(written[0], written[-1])
    tail = closing + f"{ANSWER_PREFIX}{total}"
    return body + tail, trained + [train_closing] * len(tail)


def verify_late_solution(prompt: str, response_text: str) -> bool:
    """True iff every chain line follows the rule, the closing line adds the first and last line
    results and the stated answer is its value."""
    problem = parse_prompt(prompt)
    body, sep, tail = response_text.rpartition(ANSWER_PREFIX)
    if not sep:
        return False
    lines = body.split("\n")
    if len(lines) != problem.n + 2 or lines[-1] != "":
        return False
    x = problem.x
    results = []
    for i, line in enumerate(lines[: problem.n]):
        expected, x = problem.line(problem.n - i, x)
        if line + "\n" != expected:
            return False
        results.append(x)
    m = _CLOSING_RE.match(lines[problem.n])
    if m is None or (int(m.group(1)), int(m.group(2))) != (results[0], results[-1]):
        return False
    return int(m.group(3)) == (results[0] + results[-1]) % MOD and tail == m.group(3)
