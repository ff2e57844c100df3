"""Held-out evaluation: dropping stopped rows from the batch (``eval.compact``) changes cost, not results."""

from __future__ import annotations

from pathlib import Path

import pytest
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
