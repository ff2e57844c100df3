"""Held-out evaluation: dropping stopped rows from the batch (``eval.compact``) changes cost, not results."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_fixtures import tiny_overrides

from adwin.config import load_config
from adwin.loop.evaluate import evaluate
from adwin.loop.parts import load_parts
from adwin.loop.sampler import Sampler


def _setup(tmp: Path, **extra: object):
    ov = tiny_overrides(tmp, **{"data.task": "builtin", "data.path": None, "eval.n_problems": 24, "probes.backend": "inline",
                                "rollout.max_response_len": 24, "data.n_eval": 24})
    ov.update(extra)
    cfg = load_config(None, ov)
    return cfg, load_parts(cfg)


@pytest.mark.parametrize("extra", [{"eval.temperature": 0.0}, {"rollout.seeding": "per_sample"},
                                   {"rollout.seeding": "per_sample", "eval.top_p": 0.8}])
def test_greedy_or_per_sample_evaluation_is_the_same_with_or_without_compaction(tmp_path: Path, extra) -> None:
    cfg, parts = _setup(tmp_path, **extra, **{"eval.compact": False, "eval.batch_size": 8})
    plain = evaluate(parts, cfg, Sampler(parts, cfg))
    compact_cfg = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"compact": True})})
    compact = evaluate(parts, compact_cfg, Sampler(parts, compact_cfg))
    assert compact["eval/accuracy"] == plain["eval/accuracy"]
    assert compact["eval/mean_len"] == plain["eval/mean_len"] > 1.0
    # scored in another row order (by length): the same sum up to float rounding
    assert compact["eval/teacher_kl"] == pytest.approx(plain["eval/teacher_kl"], rel=1e-5)


def test_compacted_evaluation_checks_answers_in_problem_order_and_is_repeatable(tmp_path: Path) -> None:
    cfg, parts = _setup(tmp_path, **{"eval.k": 2, "eval.batch_size": 8})
    seen: list[str] = []
    checker = parts.checker
    parts.checker = lambda text, answer: seen.append(answer) or checker(text, answer)
    first = evaluate(parts, cfg, Sampler(parts, cfg))
    # compare's per-problem statistics read the outcomes in this order: problem by problem, k samples together
    assert seen == [p.answer for p in parts.eval_prompts[:24] for _ in range(2)]
    assert evaluate(parts, cfg, Sampler(parts, cfg)) == first  # its own seeded noise, every time


def test_an_empty_evaluation_batch_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        load_config(None, {"eval.batch_size": 0})


class _TwinRanks:
    """Two ranks that drew the same rows: every sum doubles, so every mean must equal one process's."""

    rank, world, local_rank, is_main = 0, 2, 0, True

    def shard(self, n: int) -> slice:
        return slice(0, n)

    def all_sum(self, t):
        return t * 2


@pytest.mark.parametrize("task", ["chain", "chain-late"])
def test_line_measures_are_logged_and_each_row_is_kept_for_paired_statistics(tmp_path: Path, task: str,
                                                                             monkeypatch) -> None:
    from adwin.loop.evaluate import _evaluate

    monkeypatch.setenv("ADWIN_HOME", str(tmp_path / "home"))
    cfg, parts = _setup(tmp_path, **{"eval.k": 2, "eval.n_problems": 6, "data.builtin_task": task,
                                     "rollout.max_response_len": 48})
    from adwin.tasks.suite import BuiltinTask, LineScore

    # the tiny models write garbage (every measure 0): scores that vary with the text test the plumbing instead
    def score_lines(self, prompt: str, text: str) -> LineScore:
        return LineScore(len(text) % 7 / 7, None if self.closing_prefix is None else float(len(text) % 2))

    monkeypatch.setattr(BuiltinTask, "score_lines", score_lines)
    parts.eval_log = []
    seen: list[tuple[str, str]] = []
    parts.checker = lambda text, answer: seen.append((text, answer)) or len(text) % 3 == 0
    out = evaluate(parts, cfg, Sampler(parts, cfg))
    (rows,) = parts.eval_log
    measures = {"accuracy", "lines_right", "forced_lines"} | ({"closing_right"} if task == "chain-late" else set())
    assert set(rows.scores) == measures and rows.first == 0 and rows.k == 2
    from adwin.tasks.suite import get_task

    prompts = [p.prompt for p in parts.eval_prompts[:6] for _ in range(2)]
    want = [get_task(task).score_lines(p, text).lines_right for p, (text, _) in zip(prompts, seen, strict=True)]
    assert rows.scores["lines_right"] == want  # row by row, in the checker's order
    assert len({round(x, 3) for x in rows.scores["lines_right"]}) > 1  # not a constant: the test can tell rows apart
    for m in measures:
        assert out[f"eval/{m}"] == pytest.approx(sum(rows.scores[m]) / 12)
        assert rows.per_problem(m) == pytest.approx([sum(rows.scores[m][i : i + 2]) / 2 for i in range(0, 12, 2)])
    # a data-parallel evaluation sums each measure with its own count: two ranks of the same rows, the same means
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(cfg.seed)
        twin = _evaluate(parts, cfg, Sampler(parts, cfg), _TwinRanks())
    assert {k: twin[k] for k in out} == pytest.approx(out)


def test_a_jsonl_task_has_no_line_measures(tmp_path: Path) -> None:
    from trainer_fixtures import make_assets

    cfg = load_config(None, tiny_overrides(tmp_path, **make_assets(tmp_path), **{"probes.backend": "inline"}))
    parts = load_parts(cfg)
    parts.eval_log = []
    out = evaluate(parts, cfg, Sampler(parts, cfg))
    assert "eval/lines_right" not in out and set(parts.eval_log[0].scores) == {"accuracy"}
    assert not any(k.startswith("eval/forced_lines") for k in out)


def test_rows_that_split_a_problem_are_refused() -> None:
    from adwin.loop.evaluate import EvalRows

    with pytest.raises(ValueError, match="whole problems"):
        EvalRows(1, 2, {"accuracy": [1.0, 0.0]}).per_problem("accuracy")
