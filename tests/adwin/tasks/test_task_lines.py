"""The line measures of a response (``BuiltinTask.score_lines``): a right chain scores 1, a chain wrong from line
k + 1 scores k / n, garbage 0; the closing line is judged on the chain line written above it. Responses are built
from the task statements (``task_reference``), not from the generators."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from task_reference import reference_response

from adwin.tasks.chain import lines_right, written_lines
from adwin.tasks.late import closing_right
from adwin.tasks.suite import LINE_MEASURES, TASK_NAMES, get_task

LATE = ("chain-late", "chain-late-long")


def _problem(name: str, seed: int):
    return get_task(name).problems(1, seed=seed, split="eval")[0]


def _reference(name: str, seed: int) -> tuple[str, str, int]:
    """(prompt, the right response as the task statement writes it, n)."""
    p = _problem(name, seed)
    digits = get_task(name).kind.COUNTER_DIGITS
    return p.prompt, reference_response(p.route, p.x, p.a, p.b, p.n, digits, closing=name in LATE), p.n


def _break_line(response: str, k: int) -> str:
    """The response with a wrong result digit on line ``k`` (0-based), every other character kept."""
    lines = response.split("\n")
    lines[k] = lines[k][:-1] + str((int(lines[k][-1]) + 1) % 10)
    return "\n".join(lines)


@pytest.mark.parametrize("name", TASK_NAMES)
def test_a_right_response_scores_one_on_every_measure(name: str) -> None:
    prompt, response, _ = _reference(name, 0)
    score = get_task(name).score_lines(prompt, response)
    assert score.lines_right == 1.0
    assert score.closing_right == (1.0 if name in LATE else None)
    assert set(score.measures()) == set(get_task(name).line_measures)
    assert get_task(name).line_measures == (LINE_MEASURES if name in LATE else LINE_MEASURES[:1])


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(TASK_NAMES), seed=st.integers(0, 50), where=st.floats(0, 1, exclude_max=True))
def test_a_response_wrong_from_line_k_plus_one_scores_k_over_n(name: str, seed: int, where: float) -> None:
    prompt, response, n = _reference(name, seed)
    k = int(where * n)
    broken = _break_line(response, k)
    assert get_task(name).score_lines(prompt, broken).lines_right == pytest.approx(k / n)
    # every line after the wrong one may be right or wrong: the run from the start is what counts
    again = _break_line(broken, n - 1) if k < n - 1 else broken
    assert get_task(name).score_lines(prompt, again).lines_right == pytest.approx(k / n)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(TASK_NAMES), seed=st.integers(0, 50), cut=st.floats(0, 1))
def test_a_cut_response_counts_only_its_finished_lines(name: str, seed: int, cut: float) -> None:
    prompt, response, n = _reference(name, seed)
    text = response[: int(cut * len(response))]
    finished = min(n, text.count("\n"))
    assert get_task(name).score_lines(prompt, text).lines_right == pytest.approx(finished / n)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(TASK_NAMES), seed=st.integers(0, 50),
       text=st.text(alphabet="0123456789:+-*=\nfinas ", max_size=300))
def test_garbage_scores_zero(name: str, seed: int, text: str) -> None:
    prompt, response, _ = _reference(name, seed)
    first = response.split("\n")[0]
    if text.split("\n")[0] == first:  # hypothesis found the first line itself: not garbage
        return
    score = get_task(name).score_lines(prompt, text)
    assert score.lines_right == 0.0
    assert get_task(name).score_lines(prompt, "").lines_right == 0.0


def test_lines_beyond_the_chain_and_the_answer_do_not_count() -> None:
    prompt, response, n = _reference("chain-long", 3)
    assert lines_right(response, response + "\n001:1*3=3+0=3\n", n) == n
    assert lines_right("a\nb\nc", "a\nb\nc\n", 3) == 3 and lines_right("a\nb\nc", "a\nb\nc", 3) == 2
    assert written_lines("a\nb") == ["a"] and written_lines("") == []


@pytest.mark.parametrize("name", LATE)
def test_the_closing_line_is_judged_on_the_chain_line_written_above_it(name: str) -> None:
    rng = random.Random(0)
    for seed in range(20):
        prompt, response, n = _reference(name, seed)
        lines = response.split("\n")
        # the last chain line written wrong, the closing line computed from what was written: the closing skill holds
        wrong = _break_line(response, n - 1).split("\n")
        x, q = int(wrong[n - 1].split(":")[1][0]), int(wrong[n - 1][-1])
        wrong[n] = f"fin:{x}+{q}={(x + q) % 10}"
        assert get_task(name).score_lines(prompt, "\n".join(wrong)).closing_right == 1.0
        assert get_task(name).score_lines(prompt, "\n".join(wrong)).lines_right == pytest.approx((n - 1) / n)
        # the reference's closing line under that wrong chain line: wrong for what was written
        wrong[n] = lines[n]
        assert get_task(name).score_lines(prompt, "\n".join(wrong)).closing_right == 0.0
        # a wrong sum, no closing line, a closing line cut before its newline, or one with no chain line above it
        a, b, s = (int(c) for c in lines[n][4:].replace("+", "=").split("="))
        bad = lines[:n] + [f"fin:{a}+{b}={(s + rng.randint(1, 9)) % 10}"] + lines[n + 1:]
        assert closing_right("\n".join(bad)) is False
        assert closing_right("\n".join(lines[:n] + lines[n + 1:])) is False
        assert closing_right("\n".join(lines[: n + 1])) is False
        assert closing_right(lines[n] + "\n" + lines[n + 1]) is False


def test_a_task_without_a_closing_line_has_no_closing_measure() -> None:
    prompt, response, _ = _reference("chain-long", 0)
    assert get_task("chain-long").score_lines(prompt, response).closing_right is None
    assert get_task("chain-long").score_lines(prompt, response).measures() == {"lines_right": 1.0}
