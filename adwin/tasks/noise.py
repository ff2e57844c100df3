"""Corrupted reference solutions, so the teacher learns to give useful feedback after a mistake.

On-policy distillation scores the *student's* rollouts, and a weak student makes mistakes early. A
teacher trained only on clean solutions has never seen a prefix with a wrong digit or a wrong
counter, and its predictions there are arbitrary: we measured that a clean-only teacher rated
"keep writing lines" as likely after a derailed counter, so OPD taught the student to ramble and its
accuracy fell with every window policy (docs/decisions.md, "Built-in task: the teacher is trained to continue after mistakes").

The fix is the task's own local rule: every line follows from what the previous line *wrote*, and the
answer follows the line whose counter is ``01``. :func:`corrupt_solution` writes a solution in which a
few fields are wrong (the start value, an operand, the intermediate, the result or the counter) and
every later field follows the written, wrong, values. The wrong characters are masked out of the SFT
loss, so the teacher never learns to make mistakes, only to continue sensibly after one. Its feedback
on a derailed student rollout then says "this line is right given the last one", which is exactly the
dense, local signal OPD needs.
"""

from __future__ import annotations

import random

from adwin.tasks.chain import ANSWER_PREFIX, MOD, OPERATORS, Problem, first_op, second_op

KINDS: tuple[str, ...] = ("x", "operand", "p", "q", "counter")


def _other_digit(rng: random.Random, digit: int) -> int:
    return rng.choice([d for d in range(MOD) if d != digit])


def corrupt_solution(problem: Problem, rng: random.Random, line_rate: float) -> tuple[str, list[bool]]:
    """A written response (without EOS) and, per character, whether it is trained on (False where
    the character is a planted mistake). Each line is corrupted with probability ``line_rate`` in
    one field; ``line_rate = 0`` gives the clean solution with every character trained on."""
    text: list[str] = []
    trained: list[bool] = []

    def put(field: str, ok: bool = True) -> None:
        text.append(field)
        trained.extend([ok] * len(field))

    op1, op2 = OPERATORS[problem.route]
    x, counter, lines = problem.x, problem.n, 0
    while counter >= 1:
        kind = rng.choice(KINDS) if rng.random() < line_rate else None
        if kind is None:  # most lines: the clean line in one piece (what the field-by-field path below writes unflagged)
            line, x = problem.line(counter, x)
            put(line)
            counter, lines = counter - 1, lines + 1
            continue
        if kind == "counter":
            # a wrong counter is followed, so the response must still fit the format's longest chain
            options = [c for c in range(1, problem.MAX_N - lines + 1) if c != counter]
            if options:
                counter = rng.choice(options)
                put(problem.counter_text(counter), ok=False)
            else:
                put(problem.counter_text(counter))
        else:
            put(problem.counter_text(counter))
        put(":")
        if kind == "x":
            x = _other_digit(rng, x)
        put(str(x), ok=kind != "x")
        put(op1)
        first, second = problem.a, problem.b
        wrong = rng.choice(("first", "second")) if kind == "operand" else None
        if wrong == "first":
            first = _other_digit(rng, first)
        put(str(first), ok=wrong != "first")
        p = first_op(problem.route, x, first)
        put("=")
        if kind == "p":
            p = _other_digit(rng, p)
        put(str(p), ok=kind != "p")
        put(op2)
        if wrong == "second":
            second = _other_digit(rng, second)
        put(str(second), ok=wrong != "second")
        q = second_op(problem.route, p, second)
        put("=")
        if kind == "q":
            q = _other_digit(rng, q)
        put(str(q), ok=kind != "q")
        put("\n")
        x, counter, lines = q, counter - 1, lines + 1
    put(f"{ANSWER_PREFIX}{x}")
    return "".join(text), trained
