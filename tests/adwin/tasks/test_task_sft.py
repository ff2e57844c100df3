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


def _late_batch(tok, task_name: str = "chain-late", n: int = 6):
    from adwin.tasks.profiles import ModelSpec
    from adwin.tasks.suite import get_task

    task = get_task(task_name)
    input_ids, _, labels = make_batches(tok, task.problems(n, seed=1), batch_size=n, seed=0, task=task)[0]
    model = ModelSpec(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32).build(len(tok), tok, seed=0)
    return task, model, input_ids, labels


def test_closing_mask_starts_at_the_first_occurrence_of_the_prefix() -> None:
    import torch

    from adwin.tasks.sft import closing_mask

    ids = torch.tensor([[5, 1, 2, 3, 1, 2, 3],   # the prefix at 1 and again at 4: from 1 on
                        [1, 2, 9, 1, 2, 9, 9],   # a partial match is not one
                        [7, 7, 7, 7, 7, 1, 2]])  # a prefix cut by the row's end is not one
    assert closing_mask(ids, [1, 2, 3]).tolist() == [
        [False] + [True] * 6, [False] * 7, [False] * 7]
    assert not closing_mask(ids[:, :2], [1, 2, 3]).any()  # a row shorter than the prefix


def test_weighted_loss_at_weight_one_is_the_llama_loss(tok) -> None:
    import torch

    from adwin.tasks.sft import closing_mask, weighted_lm_loss

    task, model, input_ids, labels = _late_batch(tok)
    closing = closing_mask(input_ids, tok(task.closing_prefix, add_special_tokens=False)["input_ids"])
    assert closing.any(1).all()  # every chain-late response has its closing line
    with torch.no_grad():
        out = model(input_ids=input_ids, labels=labels)
    assert float(weighted_lm_loss(out.logits, labels, closing, 1.0)) == pytest.approx(float(out.loss), rel=1e-6)


def test_weighted_loss_matches_a_per_token_reference(tok) -> None:
    """sum(w * ce) / sum(w) with w = 3 from the closing prefix's first target on, computed token by token."""
    import math

    import torch

    from adwin.tasks.sft import closing_mask, weighted_lm_loss

    task, model, input_ids, labels = _late_batch(tok, n=3)
    prefix = tok(task.closing_prefix, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits  # (B, T, V)
    total = weight_sum = 0.0
    for b in range(input_ids.size(0)):
        row = input_ids[b].tolist()
        start = next(i for i in range(len(row)) if row[i : i + len(prefix)] == prefix)
        for t in range(1, len(row)):
            if int(labels[b, t]) == -100:
                continue
            w = 3.0 if t >= start else 1.0
            total += -w * float(torch.log_softmax(logits[b, t - 1].double(), -1)[labels[b, t]])
            weight_sum += w
    got = float(weighted_lm_loss(logits, labels, closing_mask(input_ids, prefix), 3.0))
    assert math.isclose(got, total / weight_sum, rel_tol=1e-5)


def test_a_closing_weight_is_refused_before_training_where_the_task_has_no_closing_phase(tok) -> None:
    from adwin.tasks.sft import train_sft
    from adwin.tasks.suite import get_task

    _, model, _, _ = _late_batch(tok)
    before = [p.detach().clone() for p in model.parameters()]
    schedule = SFTSchedule(steps=2, batch_size=2, lr=1e-2, warmup=1, closing_weight=2.0)
    with pytest.raises(ValueError, match="closing_weight"):
        train_sft(model, tok, schedule, seed=0, task=get_task("chain"))
    assert all((a == b).all() for a, b in zip(before, model.parameters(), strict=True))
    with pytest.raises(ValueError, match="closing_weight"):
        SFTSchedule(steps=2, batch_size=2, lr=1e-2, closing_weight=0.0)


def test_a_task_without_a_closing_phase_refuses_a_weighted_recipe_when_it_is_defined() -> None:
    import dataclasses

    from adwin.tasks.suite import get_task

    chain = get_task("chain")
    weighted = dataclasses.replace(PROFILE_SPECS["tiny"], schedule=dataclasses.replace(
        PROFILE_SPECS["tiny"].schedule, closing_weight=2.0))
    with pytest.raises(ValueError, match="closing_prefix"):
        dataclasses.replace(chain, profiles={"tiny": weighted})
    dataclasses.replace(chain, profiles={"tiny": weighted}, closing_prefix="fin:")  # with one it is accepted


def test_a_closing_weight_changes_the_sft_steps(tok) -> None:
    import torch

    from adwin.tasks.sft import train_sft
    from adwin.tasks.suite import get_task

    task = get_task("chain-late")
    trained = {}
    for weight in (1.0, 4.0):
        _, model, _, _ = _late_batch(tok)
        schedule = SFTSchedule(steps=2, batch_size=4, lr=1e-2, warmup=1, closing_weight=weight)
        _, losses = train_sft(model, tok, schedule, seed=0, task=task)
        trained[weight] = (losses, [p.detach().clone() for p in model.parameters()])
    assert trained[1.0][0][0] != trained[4.0][0][0]  # the first step's loss already differs
    assert not all(torch.equal(a, b) for a, b in zip(trained[1.0][1], trained[4.0][1], strict=True))
