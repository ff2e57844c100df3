"""Teacher-forced line skill: a line is scored at its own position, whatever the lines above it, and lands in the
window bin its last token falls in."""

from __future__ import annotations

import logging

import pytest
import torch

import adwin.tasks.row_scores as row_scores
from adwin.sampling.rollout import encode_prompts
from adwin.tasks.forced import (
    ForcedLines,
    NotCharacterLevel,
    bin_edges,
    binned,
    forced_lines,
    reads_characters,
    reference_lines,
)
from adwin.tasks.row_scores import Forcing, score_rows
from adwin.tasks.suite import get_task
from adwin.tasks.tokenizer import build_tokenizer


class _Oracle(torch.nn.Module):
    """Predicts the next token of the row it reads (it peeks), except at response offsets in ``wrong``: what the
    score must read as exactly the lines holding those offsets."""

    def __init__(self, vocab: int, prompt_len: int, wrong: set[int]) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.vocab, self.prompt_len, self.wrong = vocab, prompt_len, wrong

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):  # (B, L) each
        nxt = torch.roll(input_ids, -1, dims=1)  # (B, L): the token after each position
        for off in self.wrong:  # the response token at offset off is predicted at position prompt_len + off - 1
            nxt[:, self.prompt_len + off - 1] = (nxt[:, self.prompt_len + off - 1] + 1) % self.vocab
        logits = torch.nn.functional.one_hot(nxt, self.vocab).float()  # (B, L, V)

        class Out:
            pass

        out = Out()
        out.logits = logits
        return out


@pytest.mark.parametrize("task_name", ["chain", "chain-long"])
def test_an_error_scores_only_the_line_it_is_in(task_name: str) -> None:
    task = get_task(task_name)
    tok = build_tokenizer()
    prompt = task.problems(1, 0, "eval")[0].prompt
    ids = encode_prompts(tok, [prompt], 64)
    solution, ends = reference_lines(task, prompt)
    assert len(ends) >= 3 and solution[ends[0] - 1] == "\n"
    clean = forced_lines(_Oracle(len(tok), len(ids[0]), set()), tok, task, ids, [prompt], pad_id=tok.pad_token_id)
    assert clean[0].right == (True,) * len(ends) and clean[0].ends == tuple(ends)
    # a wrong first character of line 2 and a wrong newline ending line 3: lines 2 and 3 wrong, 1 and 4+ right
    hurt = forced_lines(_Oracle(len(tok), len(ids[0]), {ends[0], ends[2] - 1}), tok, task, ids, [prompt],
                        pad_id=tok.pad_token_id)
    assert hurt[0].right[:4] == (True, False, False, True) and all(hurt[0].right[3:])
    assert hurt[0].share == pytest.approx(1 - 2 / len(ends))


def test_rows_of_different_lengths_in_one_batch_are_each_scored_at_their_own_positions() -> None:
    task = get_task("chain")
    tok = build_tokenizer()
    prompts = [p.prompt for p in task.problems(6, 0, "eval")]
    ids = encode_prompts(tok, prompts, 64)
    assert len({len(reference_lines(task, p)[0]) for p in prompts}) > 1  # padding differs between rows
    got = forced_lines(_Oracle(len(tok), len(ids[0]), set()), tok, task, ids, prompts, pad_id=tok.pad_token_id,
                       batch_size=4)
    assert [all(r.right) for r in got] == [True] * 6


def test_lines_fall_in_the_bin_their_last_token_ends_in() -> None:
    assert bin_edges([32, 64, 128], 320) == [(0, 32), (32, 64), (64, 128), (128, 320)]
    rows = [ForcedLines((True, False, True), (14, 28, 42)), ForcedLines((True, True, False), (14, 70, 400))]
    # (0, 32]: ends 14 (right), 28 (wrong), 14 (right); (32, 64]: 42; (64, 128]: 70; the last bin also takes the
    # line ending at 400, past a horizon shorter than the reference
    assert binned(rows, [32, 64, 128], 320) == {32: (2, 3), 64: (1, 1), 128: (1, 1), 320: (0, 1)}


class _Pairs:
    """A tokenizer that spells two characters a token, as a BPE tokenizer of a model of one's own would merge them."""

    def __call__(self, text, add_special_tokens: bool = False) -> dict:
        def spell(t: str) -> list[int]:
            return [ord(t[i]) % 50 for i in range(0, len(t), 2)]

        return {"input_ids": spell(text) if isinstance(text, str) else [spell(t) for t in text]}


def test_a_tokenizer_that_is_not_character_level_leaves_the_forced_score_out_of_an_evaluation(caplog,
                                                                                               monkeypatch) -> None:
    """A student with a tokenizer of its own on a built-in task: the evaluation keeps its other measures and leaves the
    forced score out, warning once; ``forced_lines`` itself refuses such a tokenizer by type."""
    monkeypatch.setattr(row_scores, "_warned", set())
    task = get_task("chain")
    tok, pairs = build_tokenizer(), _Pairs()
    assert reads_characters(tok, task) and not reads_characters(pairs, task)
    prompts = [p.prompt for p in task.problems(2, 0, "eval")]
    ids = encode_prompts(tok, prompts, 64)
    oracle = _Oracle(len(tok), len(ids[0]), set())
    forcing = Forcing(oracle, pairs, ids, 0, 1, tok.pad_token_id, 4, [32, 64], 320)
    with caplog.at_level(logging.WARNING, logger=row_scores.__name__):
        for _ in range(2):  # two evaluations of one run
            lines, bins = score_rows("chain", prompts, ["", ""], forcing)
            assert set(lines) == set(task.line_measures) and "forced_lines" not in lines and bins == {}
    assert sum("eval/forced_lines: not scored" in r.getMessage() for r in caplog.records) == 1
    lines, bins = score_rows("chain", prompts, ["", ""], Forcing(oracle, tok, ids, 0, 1, tok.pad_token_id, 4,
                                                                 [32, 64], 320))
    assert lines["forced_lines"] == [1.0, 1.0] and bins  # the built-in tokenizer: scored
    with pytest.raises(NotCharacterLevel):
        forced_lines(oracle, pairs, task, ids, prompts, pad_id=tok.pad_token_id)
