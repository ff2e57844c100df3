"""SFT batches of the built-in task: only response tokens (and <eos>) carry labels."""

from __future__ import annotations

import pytest

from adwin.tasks import generate_problems
from adwin.tasks.profiles import PROFILE_SPECS, SFTSchedule
from adwin.tasks.sft import encode_example, make_batches
from adwin.tasks.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_labels_cover_exactly_response_and_eos(tok) -> None:
    problems = generate_problems(24, seed=0)
    batches = make_batches(tok, problems, batch_size=8, seed=0)
    assert sum(b[0].shape[0] for b in batches) == len(problems)
    expected = {tuple(encode_example(tok, p)[0]): p for p in problems}
    for input_ids, mask, labels in batches:
        for row in range(input_ids.shape[0]):
            n = int(mask[row].sum())
            ids = tuple(input_ids[row, :n].tolist())
            p = expected[ids]
            assert (input_ids[row, n:] == tok.pad_token_id).all()  # right padding
            labelled = labels[row][labels[row] != -100].tolist()
            assert tok.decode(labelled[:-1]) == p.solution() and labelled[-1] == tok.eos_token_id
            n_prompt = len(tok(p.prompt)["input_ids"])
            assert (labels[row, :n_prompt] == -100).all() and (labels[row, n:] == -100).all()


def test_lr_schedule_warms_up_then_decays_to_floor() -> None:
    s = SFTSchedule(steps=100, batch_size=1, lr=1e-2, warmup=10, min_lr_ratio=0.1)
    lrs = [s.lr_at(i) for i in range(100)]
    assert lrs[0] < lrs[9] == pytest.approx(1e-2)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lrs[-1] == pytest.approx(1e-3, rel=0.01)


def test_profiles_snapshot_the_student_before_the_teacher_finishes() -> None:
    for spec in PROFILE_SPECS.values():
        assert 0 < spec.student_step < spec.schedule.steps


@pytest.mark.parametrize("task_name", ["chain", "chain-late"])
@pytest.mark.parametrize("student_phase", [False, True])
def test_batched_encoding_plants_the_mistakes_one_call_per_problem_would(tok, task_name, student_phase) -> None:
    """encode_examples writes every response before tokenizing; the planted mistakes (drawn from one rng
    in problem order) and the labels must be what encoding the problems one by one gives."""
    import random

    from adwin.tasks.sft import encode_examples
    from adwin.tasks.suite import get_task

    task = get_task(task_name)
    problems = task.problems(40, seed=3)
    one_by_one_rng, batched_rng = random.Random(5), random.Random(5)
    one_by_one = [encode_example(tok, p, one_by_one_rng, 0.3, task, student_phase) for p in problems]
    batched = encode_examples(tok, problems, batched_rng, 0.3, task, student_phase)
    assert batched == one_by_one
    assert any(-100 in labels[len(tok(p.prompt)["input_ids"]):] for (_, labels), p in zip(batched, problems, strict=True))
    assert one_by_one_rng.random() == batched_rng.random()  # the same number of draws


def test_no_problems_make_no_batches(tok) -> None:
    assert make_batches(tok, [], batch_size=8, seed=0) == []
