"""The three built-in tasks: chain-late's rule against an independent implementation, splits disjoint
for every task, chain-drift's teacher data clean, and the late skill absent from the student init."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from pydantic import ValidationError
from task_reference import reference_response

from adwin.config import DataConfig
from adwin.tasks import late
from adwin.tasks.chain import MOD, Problem, split_problems
from adwin.tasks.late import verify_late_solution, write_late
from adwin.tasks.phases import phase_spans
from adwin.tasks.profiles import PROFILE_SPECS
from adwin.tasks.sft import encode_example, train_sft
from adwin.tasks.suite import TASK_NAMES, get_task
from adwin.tasks.tokenizer import build_tokenizer


def reference_late(route: str, x: int, a: int, b: int, n: int) -> str:
    """chain-late's response written from the task statement (tests/adwin/tasks/task_reference.py)."""
    return reference_response(route, x, a, b, n, closing=True)


def test_chain_late_solutions_and_answers_match_an_independent_implementation() -> None:
    task = get_task("chain-late")
    problems = [p for p in split_problems("eval") if p.n <= task.max_steps]
    assert len(problems) > 2000
    for p in problems:
        want = reference_late(p.route, p.x, p.a, p.b, p.n)
        assert task.solution(p) == want
        assert task.answer(p) == want[-1]
        assert verify_late_solution(p.prompt, want)


def test_chain_late_verifier_rejects_a_wrong_closing_line() -> None:
    p = Problem("muladd", 4, 3, 5, 3)
    good = reference_late("muladd", 4, 3, 5, 3)  # 03:4*3=2+5=7 02:7*3=1+5=6 01:6*3=8+5=3 fin:6+3=9 ans=9
    assert good.endswith("01:6*3=8+5=3\nfin:6+3=9\nans=9")
    for bad in (good.replace("fin:6+3=9", "fin:7+3=0").replace("ans=9", "ans=0"),  # the first result, not the input
                good.replace("fin:6+3=9\nans=9", "fin:6+3=8\nans=8"),  # wrong sum
                good.replace("fin:6+3=9\n", ""),  # no closing line: the chain task's response
                good.replace("ans=9", "ans=3")):  # the chain answer
        assert not verify_late_solution(p.prompt, bad)


@pytest.mark.parametrize("seed", range(3))
def test_chain_late_closing_combines_the_written_values_after_planted_mistakes(seed: int) -> None:
    rng = random.Random(seed)
    for p in get_task("chain-late").problems(40, seed):
        text, trained = write_late(p, rng, line_rate=0.3)
        lines = text.split("\n")
        start, result = int(lines[-3][3]), int(lines[-3][-1])  # the last line as written, mistakes included
        assert lines[-2] == f"fin:{start}+{result}={(start + result) % MOD}"
        assert lines[-1] == f"ans={(start + result) % MOD}"
        assert all(trained[len(text) - len(lines[-2]) - len(lines[-1]) - 1 :])


@pytest.mark.parametrize("name", TASK_NAMES)
def test_train_and_eval_prompts_are_disjoint_for_every_task(name: str) -> None:
    task = get_task(name)
    train = {s.prompt for s in task.samples(3000, seed=0, split="train")}
    held = {s.prompt for s in task.samples(1000, seed=0, split="eval")}
    assert train and held and not train & held


def test_chain_and_chain_drift_share_problems_and_answers_chain_late_its_own_answers() -> None:
    chain, drift, late = (get_task(n).samples(200, seed=3, split="eval") for n in ("chain", "chain-drift", "chain-late"))
    assert chain == drift
    late_problems = {s.prompt for s in late}
    assert late_problems <= {s.prompt for s in get_task("chain").samples(400, seed=3, split="eval")}
    assert any(a.answer != b.answer for a, b in zip(chain, late, strict=False) if a.prompt == b.prompt)


def _response_labels(task_name: str, n: int, rate: float, student_phase: bool = False) -> list[list[int]]:
    tok = build_tokenizer()
    task, rng = get_task(task_name), random.Random(0)
    out = []
    for p in task.problems(n, seed=0):
        ids, labels = encode_example(tok, p, rng, rate, task, student_phase)
        out.append(labels[len(tok(p.prompt)["input_ids"]) :])
    return out


def test_chain_drift_teacher_trains_on_clean_solutions_only() -> None:
    rate = PROFILE_SPECS["default"].schedule.noise_line_rate
    assert rate > 0
    line_rate = get_task("chain-drift").noise_line_rate
    assert line_rate == 0.0
    assert all(-100 not in row for row in _response_labels("chain-drift", 200, line_rate))
    assert any(-100 in row for row in _response_labels("chain", 200, rate))  # chain plants mistakes


def test_student_phase_masks_the_closing_digits_and_trains_its_format_and_the_eos() -> None:
    task = get_task("chain-late")
    student = _response_labels("chain-late", 50, 0.0, student_phase=True)
    teacher = _response_labels("chain-late", 50, 0.0)
    for p, s_row, t_row in zip(task.problems(50, seed=0), student, teacher, strict=True):
        text = task.solution(p)
        lo, hi = phase_spans(text)["late"]
        closing = len(text) - len(text.split("\n")[-2]) - 6  # start of "fin:"
        assert (lo, hi) == (closing, len(text))  # the late phase is the closing phase
        assert all(v != -100 for v in s_row[:closing])  # the chain lines are trained
        tail = text[closing:]
        assert [v == -100 for v in s_row[closing:-1]] == [c.isdigit() for c in tail]  # digits masked, format kept
        assert sum(c.isdigit() for c in tail) == 4  # A, B, S and the answer
        assert s_row[-1] != -100 and t_row[-1] != -100  # both learn to stop
        assert all(v != -100 for v in t_row)


def test_student_snapshot_step_is_later_for_chain_late_and_inside_the_run() -> None:
    spec = PROFILE_SPECS["default"]
    assert get_task("chain").student_step(spec.student_step, spec.schedule.steps) == spec.student_step
    assert get_task("chain-late").student_step(spec.student_step, spec.schedule.steps) == 800
    tiny = PROFILE_SPECS["tiny"]
    assert 0 < get_task("chain-late").student_step(tiny.student_step, tiny.schedule.steps) < tiny.schedule.steps


@pytest.mark.parametrize("name", ["chain-late", "chain-late-long"])
def test_student_init_learns_nothing_about_the_closing_rule(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The student snapshot is the same whatever the closing rule says, even through the context (its
    closing digits are random): a changed rule changes the teacher's SFT but not one weight of the
    student's (on the tiny profile)."""
    task = get_task(name)
    spec = task.profile("tiny")
    tok = build_tokenizer()

    def weights(student_phase: bool) -> list[torch.Tensor]:
        model = spec.model.build(len(tok), tok, seed=0)
        stop = task.student_step(spec.student_step, spec.schedule.steps)
        train_sft(model, tok, spec.schedule, seed=0, stop_step=stop, task=task, student_phase=student_phase,
                  progress_desc="test")
        return [p.detach().clone() for p in model.parameters()]

    rule = weights(True), weights(False)
    monkeypatch.setattr(late, "closing_line", lambda a, b: (f"fin:{a}+{b}={(a - b) % MOD}\n", (a - b) % MOD))
    other = weights(True), weights(False)
    assert all(torch.equal(a, b) for a, b in zip(rule[0], other[0], strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(rule[1], other[1], strict=True))


def test_config_names_the_allowed_tasks_and_refuses_builtin_task_for_jsonl() -> None:
    assert DataConfig(builtin_task="chain-late").builtin_task == "chain-late"
    with pytest.raises(ValidationError, match="chain, chain-drift, chain-late"):
        DataConfig(builtin_task="chain-early")
    with pytest.raises(ValidationError, match="builtin_task"):
        DataConfig(task="jsonl", path="x.jsonl", builtin_task="chain-late")


def test_a_new_rule_version_invalidates_the_prepared_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    from adwin.tasks import assets, suite

    before = assets.profile_fingerprint("tiny", "chain-late")
    bumped = dataclasses.replace(suite.TASKS["chain-late"], rule_version=99)
    monkeypatch.setitem(suite.TASKS, "chain-late", bumped)
    bumped_fingerprint = assets.profile_fingerprint("tiny", "chain-late")
    assert bumped_fingerprint != before
    later = dataclasses.replace(bumped, student_step_scale=1.5)  # the same rule, another student snapshot
    monkeypatch.setitem(suite.TASKS, "chain-late", later)
    assert assets.profile_fingerprint("tiny", "chain-late") != bumped_fingerprint
    assert assets.profile_fingerprint("tiny", "chain") == assets.profile_fingerprint("tiny")
