"""The teacher protocol's answers: both forms parse into the same scores, and every bad answer is refused
naming its field (nothing is trained on a partial or mismatched answer)."""

from __future__ import annotations

import math

import pytest
from fake_teacher import dist, echo_answer, key, vllm_answer
from hypothesis import given, settings
from hypothesis import strategies as st

from adwin.teacher.protocol import (
    TeacherAnswerError,
    completion_request,
    parse_completion,
)

URL = "http://127.0.0.1:1/v1"


def test_both_forms_give_the_same_realized_and_topk_scores() -> None:
    seqs = [[1, 5, 3, 7], [2, 4], [6, 0, 2, 2, 1]]
    a = parse_completion(URL, vllm_answer(seqs, 8, 3), seqs, "prompt_logprobs", 3)
    b = parse_completion(URL, echo_answer(seqs, 8, 3), seqs, "echo", 3)
    for seq, ra, rb in zip(seqs, a, b, strict=True):
        assert len(ra.realized) == len(seq) - 1
        assert ra.realized == rb.realized and ra.topk_ids == rb.topk_ids and ra.topk_logprobs == rb.topk_logprobs
        for ids, lps in zip(ra.topk_ids, ra.topk_logprobs, strict=True):
            assert len(ids) == 3 and lps == sorted(lps, reverse=True)  # by rank, the realized token not added
    assert a[0].tokens == ["f", "d", "h"]  # decoded_token of the realized ids (the tokenizer check reads them)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=9), min_size=1, max_size=5), st.integers(0, 12))
def test_the_parsed_scores_are_the_served_distribution(seqs: list[list[int]], k: int) -> None:
    rows = parse_completion(URL, vllm_answer(seqs, 12, k), seqs, "prompt_logprobs", k)
    for seq, row in zip(seqs, rows, strict=True):
        for j in range(1, len(seq)):
            d = dist(12, key(seq[:j]))
            assert row.realized[j - 1] == d[seq[j]]
            if k:
                assert row.topk_ids[j - 1] == sorted(range(12), key=lambda t: -d[t])[:k]


def test_the_request_bodies_are_the_documented_ones() -> None:
    a = completion_request("m", [[1, 2]], "prompt_logprobs", 0, 1)
    assert a == {"model": "m", "prompt": [[1, 2]], "max_tokens": 1, "temperature": 1.0, "n": 1, "stream": False,
                 "prompt_logprobs": 1}
    b = completion_request("m", [[1, 2]], "echo", 5, 0)
    assert b["echo"] is True and b["logprobs"] == 5 and b["return_tokens_as_token_ids"] is True
    assert "return_tokens_as_token_ids" not in completion_request("m", [[1, 2]], "echo", 0, 1)


def _break(answer: dict, path: list, value: object) -> dict:
    node = answer
    for p in path[:-1]:
        node = node[p]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return answer


SEQS = [[1, 5, 3, 7], [2, 4, 6]]


@pytest.mark.parametrize("path,value,field", [
    (["choices"], None, "choices"),
    (["choices", 0, "index"], 5, "choices[0].index"),
    (["choices", 1, "index"], 1, "choices[1].index"),  # two choices for prompt 1
    (["choices", 1, "prompt_logprobs"], KeyError, "choices[0].prompt_logprobs"),
    (["choices", 1, "prompt_logprobs", 3], KeyError, "choices[0].prompt_logprobs"),  # wrong length
    (["choices", 1, "prompt_logprobs", 2], None, "choices[0].prompt_logprobs[2]"),
    (["choices", 1, "prompt_logprobs", 2, "3"], KeyError, "choices[0].prompt_logprobs[2]"),  # another token
    (["choices", 1, "prompt_logprobs", 2, "3", "logprob"], math.nan, "choices[0].prompt_logprobs[2].3.logprob"),
    (["choices", 1, "prompt_logprobs", 2, "3", "logprob"], 0.5, "choices[0].prompt_logprobs[2].3.logprob"),
    (["choices", 1, "prompt_logprobs", 2, "3", "logprob"], "-1.0", "choices[0].prompt_logprobs[2].3.logprob"),
    (["choices", 1, "prompt_logprobs", 2, "3", "rank"], 0, "choices[0].prompt_logprobs[2].3.rank"),
])
def test_a_malformed_vllm_answer_is_refused_naming_the_field(path: list, value: object, field: str) -> None:
    answer = vllm_answer(SEQS, 8, 2)  # choices reversed: choices[1] is prompt 0
    with pytest.raises(TeacherAnswerError) as err:
        parse_completion(URL, _break(answer, path, value), SEQS, "prompt_logprobs", 2)
    assert err.value.field == field and URL in str(err.value)


@pytest.mark.parametrize("path,value,field", [
    (["choices", 0, "logprobs"], None, "choices[0].logprobs.token_logprobs"),
    (["choices", 0, "logprobs", "token_logprobs"], [None, -1.0], "choices[0].logprobs.token_logprobs"),
    (["choices", 0, "logprobs", "token_logprobs", 2], math.inf, "choices[0].logprobs.token_logprobs[2]"),
    (["choices", 0, "logprobs", "token_logprobs", 2], None, "choices[0].logprobs.token_logprobs[2]"),
    (["choices", 0, "logprobs", "tokens", 2], "token_id:4", "choices[0].logprobs.tokens[2]"),  # a different id
    (["choices", 0, "logprobs", "top_logprobs"], None, "choices[0].logprobs.top_logprobs"),
])
def test_a_malformed_echo_answer_is_refused_naming_the_field(path: list, value: object, field: str) -> None:
    with pytest.raises(TeacherAnswerError) as err:
        parse_completion(URL, _break(echo_answer(SEQS, 8, 2), path, value), SEQS, "echo", 2)
    assert err.value.field == field


def test_an_echo_answer_keyed_by_text_gives_realized_tokens_but_no_topk() -> None:
    answer = echo_answer(SEQS, 8, 2, ids=False)
    rows = parse_completion(URL, answer, SEQS, "echo", 0)
    assert rows[0].realized == [dist(8, key([1]))[5], dist(8, key([1, 5]))[3], dist(8, key([1, 5, 3]))[7]]
    assert rows[0].tokens == ["f", "d", "h"]
    with pytest.raises(TeacherAnswerError, match="not a token id"):
        parse_completion(URL, answer, SEQS, "echo", 2)


def test_a_one_token_prompt_has_nothing_to_score() -> None:
    rows = parse_completion(URL, {"choices": [{"index": 0, "prompt_logprobs": [None]}]}, [[3]], "prompt_logprobs", 2)
    assert rows[0].realized == [] and rows[0].topk_ids == []
