"""Corrupted solutions for teacher SFT: planted mistakes are masked, everything after them follows the
written (wrong) values by the task's local rule, and the response still fits the horizon."""

from __future__ import annotations

import random

import pytest

from adwin.tasks.chain import MAX_STEPS, MOD, Problem, generate_problems
from adwin.tasks.noise import corrupt_solution
from adwin.tasks.sft import encode_example
from adwin.tasks.tokenizer import build_tokenizer


def rule_expected(problem: Problem, text: str) -> str:
    """What each character should be given the characters written before it: a reference of the local
    rule written independently of the generator (line ``kk:x<op>a=p<op>b=q``; ``kk`` one below the
    previous counter, the first from ``n``; ``x`` the previous ``q``; operands from the prompt)."""
    out = []
    lines = text.split("\n")
    counter, x = problem.n, problem.x
    for line in lines[:-1]:
        kk, body = line[:2], line[3:]
        wx, wa, wp, wb = int(body[0]), int(body[2]), int(body[4]), int(body[6])
        op1, op2 = ("*", "+") if problem.route == "muladd" else ("-", "*")
        p = (wx * wa) % MOD if problem.route == "muladd" else (wx - wa) % MOD
        q = (wp + wb) % MOD if problem.route == "muladd" else (wp * wb) % MOD
        out.append(f"{counter:02d}:{x}{op1}{problem.a}={p}{op2}{problem.b}={q}\n")
        counter, x = int(kk) - 1, int(body[8])
    out.append(f"ans={x}")
    return "".join(out)


@pytest.mark.parametrize("seed", range(5))
def test_every_trained_character_follows_the_written_prefix_and_mistakes_are_masked(seed: int) -> None:
    rng = random.Random(seed)
    planted = 0
    for problem in generate_problems(60, seed=seed):
        text, trained = corrupt_solution(problem, rng, line_rate=0.3)
        assert len(text) == len(trained)
        expected = rule_expected(problem, text)
        assert len(expected) == len(text)
        for ch, want, ok in zip(text, expected, trained, strict=True):
            if ch != want:
                assert not ok  # a deviation from the rule is always a masked, planted mistake
        planted += trained.count(False)
        assert text.count("\n") <= MAX_STEPS and text.split("\n")[-2].startswith("01:")
    assert planted > 0


def test_zero_rate_gives_the_clean_solution_fully_trained() -> None:
    for problem in generate_problems(20, seed=0):
        text, trained = corrupt_solution(problem, random.Random(0), line_rate=0.0)
        assert text == problem.solution() and all(trained)


def test_corruption_frequency_follows_the_line_rate() -> None:
    rng = random.Random(0)
    lines = corrupted = 0
    for problem in generate_problems(400, seed=1):
        text, trained = corrupt_solution(problem, rng, line_rate=0.1)
        start = 0
        for line in text.split("\n")[:-1]:
            lines += 1
            corrupted += not all(trained[start : start + len(line)])
            start += len(line) + 1
    assert 0.07 < corrupted / lines < 0.13


def test_encoded_labels_skip_planted_mistakes() -> None:
    tok = build_tokenizer()
    problem = Problem("submul", 3, 2, 7, 12)
    ids, labels = encode_example(tok, problem, random.Random(3), noise_line_rate=0.5)
    assert len(ids) == len(labels) and labels[-1] == tok.eos_token_id
    n_prompt = len(tok(problem.prompt)["input_ids"])
    assert all(label == -100 for label in labels[:n_prompt])
    masked = [i for i in range(n_prompt, len(ids) - 1) if labels[i] == -100]
    assert masked and all(labels[i] == ids[i] for i in range(n_prompt, len(ids)) if i not in masked)
