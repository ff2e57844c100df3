"""The v1 layout of the driver's plan: probe copies as extra sessions of their prompt, the rows read back from
TransferQueue split into training rows and copies (verl-free: the columns are plain tensors and lists here)."""

from __future__ import annotations

import torch

from adwin.trainer_adapters.verl.driver import StepPlan
from adwin.trainer_adapters.verl.fields import MAX_TOKENS, SESSIONS, WINDOW
from adwin.trainer_adapters.verl.rows_v1 import (
    ROLLOUT_N,
    items_v1,
    lay_plan,
    planned_columns,
    session_rows,
    split_keys,
)

UIDS, N, HORIZON = ["a", "b", "c"], 2, 8


def test_the_driver_is_asked_about_every_session_of_every_prompt():
    assert session_rows(UIDS, N) == [("a_0", "a"), ("a_1", "a"), ("b_0", "b"), ("b_1", "b"), ("c_0", "c"),
                                     ("c_1", "c")]


def test_copies_become_extra_sessions_of_their_prompt():
    plan = StepPlan(0, 4, probes=[0, 4, 1], probe_ids=["a_0:probe", "c_0:probe", "a_1:probe"])
    laid = lay_plan(plan, UIDS, N)
    assert laid.sessions == [4, 2, 3]  # a: 2 copies, b: none, c: one
    assert laid.probe_ids == {"a_2": "a_0:probe", "a_3": "a_1:probe", "c_2": "c_0:probe"}
    columns = planned_columns(plan, laid, UIDS, N)
    assert columns[ROLLOUT_N] == [4, 2, 3] and columns[SESSIONS] == [N] * 3
    assert columns[MAX_TOKENS] == columns[WINDOW] == [4] * 3


def test_a_sampled_batch_splits_into_training_rows_and_copies():
    keys = ["a_0_0", "a_1_0", "a_2_0", "a_3_0", "b_0_0", "b_1_0"]
    train, copies = split_keys(keys, {"a_2": "a_0:probe", "a_3": "a_1:probe"})
    assert train == [0, 1, 4, 5] and copies == [2, 3]


def test_rows_read_back_carry_the_teachers_logprobs_of_their_response_tokens():
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([5, 6])]
    responses = [torch.tensor([9, 10, 11, 12]), torch.tensor([9, 10])]
    # column c: the teacher's log-probability of the token at c + 1 (vLLM's prompt logprobs, shifted)
    teacher = [-torch.arange(7, dtype=torch.float32)[:, None] / 10, -torch.arange(4, dtype=torch.float32)[:, None]]
    fields = {"prompts": torch.nested.as_nested_tensor(prompts, layout=torch.jagged),
              "responses": torch.nested.as_nested_tensor(responses, layout=torch.jagged), "teacher_logprobs": teacher}
    items = items_v1(fields, ["a_2_0", "b_0_0"], {"a_2": "a_0:probe"}, window=2, max_len=HORIZON, version=3)
    copy, row = items
    assert copy.is_probe and copy.request_id == "a_0:probe" and copy.max_tokens == HORIZON
    assert copy.finish_reason == "eos"  # 4 tokens under the horizon
    assert copy.teacher_logprobs == torch.tensor([-0.2, -0.3, -0.4, -0.5]).tolist()
    assert copy.tokens == [9, 10, 11, 12] and copy.prompt_ids == [5, 6, 7] and copy.prompt_id == "a"
    assert not row.is_probe and row.request_id == "b_0" and row.max_tokens == 2 and row.finish_reason == "window"
    assert row.teacher_logprobs == [-1.0, -2.0] and row.submitted_version == 3
