"""The built-in chain-arithmetic task: generator, solutions, checker and train/eval split."""

from __future__ import annotations

import random

import pytest

from adwin.tasks import (
    ANSWER_PREFIX,
    MAX_RESPONSE_TOKENS,
    ROUTES,
    Problem,
    check_answer,
    generate_problems,
    generate_samples,
    parse_prompt,
    solution_for,
    verify_solution,
)
from adwin.tasks.chain import MAX_STEPS, MIN_STEPS, MOD, UNITS, all_problems, split_problems


def _reference_answer(route: str, x: int, a: int, b: int, n: int) -> int:
    # independent re-statement of the two rules
    for _ in range(n):
        x = (x * a + b) % MOD if route == "muladd" else ((x - a) * b) % MOD
    return x


def test_generator_is_deterministic_in_seed() -> None:
    assert generate_samples(50, seed=3) == generate_samples(50, seed=3)
    assert generate_samples(50, seed=3) != generate_samples(50, seed=4)
    assert generate_samples(50, seed=3, split="eval") == generate_samples(50, seed=3, split="eval")


def test_train_and_eval_problems_are_disjoint() -> None:
    train = {s.prompt for s in generate_samples(3000, seed=0, split="train")}
    evals = {s.prompt for s in generate_samples(1000, seed=0, split="eval")}
    assert train and evals and not (train & evals)
    # by construction: the two splits partition the whole problem set
    keys_train = {p.key for p in split_problems("train")}
    keys_eval = {p.key for p in split_problems("eval")}
    assert not keys_train & keys_eval
    assert len(keys_train) + len(keys_eval) == len(all_problems())
    assert 0.05 < len(keys_eval) / len(all_problems()) < 0.25


def test_unknown_split_is_rejected() -> None:
    with pytest.raises(ValueError):
        generate_samples(1, seed=0, split="test")


def test_samples_carry_route_and_answer_of_their_prompt() -> None:
    samples = generate_samples(200, seed=1)
    assert {s.route for s in samples} == set(ROUTES)
    assert len({s.id for s in samples}) == len(samples)
    for s in samples:
        p = parse_prompt(s.prompt)
        assert s.route == p.route == s.prompt.split(" ")[0]
        assert s.answer == str(_reference_answer(p.route, p.x, p.a, p.b, p.n))


def test_written_solution_is_consistent_step_by_step() -> None:
    for s in generate_samples(200, seed=2, split="eval"):
        text = solution_for(s)
        assert verify_solution(s.prompt, text)
        assert check_answer(text, s.answer)
        lines = text.split("\n")
        p = parse_prompt(s.prompt)
        assert len(lines) == p.n + 1 and lines[-1] == f"{ANSWER_PREFIX}{s.answer}"
        # re-evaluate every line from its own written operands
        x = p.x
        for k, line in enumerate(lines[:-1]):
            counter, body = line.split(":")
            assert int(counter) == p.n - k
            lhs, p_val, q_val = body.split("=")
            op1 = "*" if p.route == "muladd" else "-"
            x_written, a_written = lhs.split(op1)
            assert int(x_written) == x and int(a_written) == p.a
            expected_p = x * p.a % MOD if p.route == "muladd" else (x - p.a) % MOD
            pv, b_written = p_val.split("+" if p.route == "muladd" else "*")
            assert int(pv) == expected_p and int(b_written) == p.b
            x = (expected_p + p.b) % MOD if p.route == "muladd" else expected_p * p.b % MOD
            assert int(q_val) == x
        assert str(x) == s.answer


def test_an_early_mistake_changes_the_final_answer() -> None:
    rng = random.Random(0)
    problems = generate_problems(300, seed=5)
    for p in problems:
        wrong = rng.choice([d for d in range(MOD) if d != p.x])
        derailed = p.solution(first_x=wrong)
        assert not check_answer(derailed, p.answer)
        assert not verify_solution(p.prompt, derailed)


def test_multipliers_are_units_so_every_step_is_a_bijection() -> None:
    for route in ROUTES:
        for a in range(MOD):
            for b in range(MOD):
                mult = a if route == "muladd" else b
                if mult not in UNITS:
                    with pytest.raises(ValueError):
                        Problem(route, 0, a, b, 3)
                    continue
                p = Problem(route, 0, a, b, 3)
                assert sorted(p.step(x)[1] for x in range(MOD)) == list(range(MOD))


def test_checker_accepts_right_and_rejects_wrong_or_garbled() -> None:
    p = Problem("muladd", 4, UNITS[1], 2, 3)
    sol = p.solution()
    assert p.answer == str(_reference_answer("muladd", 4, UNITS[1], 2, 3))
    assert check_answer(sol, p.answer)
    assert check_answer(sol + "<eos>", p.answer)
    assert check_answer(f"{ANSWER_PREFIX}{p.answer}", p.answer)
    wrong = str((int(p.answer) + 1) % MOD)
    assert not check_answer(sol, wrong)
    assert not check_answer(sol.replace(ANSWER_PREFIX, "ans:"), p.answer)  # no marker
    assert not check_answer(sol[: -len(ANSWER_PREFIX) - 1], p.answer)  # truncated
    assert not check_answer("", p.answer)
    assert not check_answer("garbage 7 ans= x", p.answer)
    # only the first stated answer counts
    assert not check_answer(f"{ANSWER_PREFIX}{wrong}\n{ANSWER_PREFIX}{p.answer}", p.answer)
    assert not check_answer(f"{ANSWER_PREFIX}{p.answer}{p.answer}", p.answer)


def test_prompt_round_trips_and_bad_prompts_are_rejected() -> None:
    for p in generate_problems(100, seed=7):
        assert parse_prompt(p.prompt) == p
    for bad in ("", "muladd x=4 a=3 b=5 n=3", "divide x=1 a=1 b=1 n=3\n", "muladd x=4 a=0 b=1 n=3\n"):
        with pytest.raises(ValueError):
            parse_prompt(bad)
    with pytest.raises(ValueError):
        Problem("muladd", MOD, UNITS[1], 1, 3)  # x is not a digit of the modulus
    with pytest.raises(ValueError):
        Problem("muladd", 1, 3, 1, MAX_STEPS + 1)
    with pytest.raises(ValueError):
        Problem("muladd", 1, 3, 1, MIN_STEPS - 1)


def test_longest_response_fits_the_horizon() -> None:
    longest = Problem("submul", MOD - 1, MOD - 1, UNITS[-1], MAX_STEPS).solution()
    assert len(longest) + 1 <= MAX_RESPONSE_TOKENS  # characters are tokens; +1 for <eos>
