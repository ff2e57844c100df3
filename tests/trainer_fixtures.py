"""Tiny on-disk student/teacher checkpoints and JSONL prompts for the trainer tests (nothing from a hub).

Helpers only (imported by the trainer tests); ``tests/adwin/loop/test_trainer.py`` checks that they load
back as ordinary Hugging Face checkpoints, which everything else relies on.
"""

from __future__ import annotations

import json
from pathlib import Path

from tiny_models import make_tiny_llama

from adwin.tasks.tokenizer import build_tokenizer

VOCAB = 64  # >= the built-in character tokenizer's size; ids 0/1/2 are pad/bos/eos as in make_tiny_llama


# metric keys that measure time (they differ between two runs of the same seed); a run compared for
# reproducibility drops them
TIMING_KEYS = ("time/", "pipeline/", "decision/seconds", "decision/learner_share", "audit/time", "probe/blocked_s",
               "probe/sync_s", "probe/rider_s", "async/throughput", "audit/lag_steps", "audit/in_flight",
               "audit/weights_version")


def save_tiny(path: Path, seed: int, vocab_size: int = VOCAB, with_tokenizer: bool = True) -> Path:
    model = make_tiny_llama(vocab_size=vocab_size, seed=seed)
    model.generation_config.eos_token_id = 2
    model.generation_config.pad_token_id = 0
    model.save_pretrained(path)
    if with_tokenizer:
        build_tokenizer().save_pretrained(str(path))
    return path


def write_prompts(path: Path, n: int = 24, routes: tuple[str, ...] = ("default",)) -> Path:
    with path.open("w") as fh:
        for i in range(n):
            a, b = i % 7, (i * 3) % 5
            rec = {"prompt": f"{a}+{b}=", "answer": str(a + b), "teacher": routes[i % len(routes)]}
            fh.write(json.dumps(rec) + "\n")
    return path


def make_assets(tmp: Path, routes: tuple[str, ...] = ("default",)) -> dict[str, object]:
    """Student, one teacher per route and a prompt file; returns the config overrides that use them."""
    student = save_tiny(tmp / "student", seed=0)
    teachers = {r: str(save_tiny(tmp / f"teacher-{r}", seed=10 + i)) for i, r in enumerate(routes)}
    data = write_prompts(tmp / "prompts.jsonl", routes=routes)
    return {
        "model.student": str(student),
        "model.teachers": teachers,
        "data.task": "jsonl",
        "data.path": str(data),
        "out_dir": str(tmp / "runs"),
    }


def tiny_overrides(tmp: Path, **extra: object) -> dict[str, object]:
    """A 2-3 step run small enough for the suite: 16-token horizon, windows 4/8, P=2, S=2."""
    ov: dict[str, object] = make_assets(tmp)
    ov.update({
        "steps": 3,
        "rollout.prompts_per_step": 2,
        "rollout.samples_per_prompt": 2,
        "rollout.max_response_len": 16,
        "window.candidates": [4, 8],
        "probes.batch_size": 2,
        "probes.offers_per_step": 2,
        "probes.staleness_limit": 2,
        "eval.n_problems": 2,
        "eval.every": 2,
        "data.n_eval": 2,
        "controller.serve": False,
        "logging.progress": False,
        "optim.lr": 1e-3,
        # runs here are compared for reproducibility: the budget on FLOPs alone (the learner's clock makes offers
        # depend on the machine; its gate is tested in tests/adwin/audit/test_budget.py and tests/adwin/loop/test_trainer_budget.py)
        "audit.budget_seconds": False,
    })
    ov.update(extra)
    return ov


def write_config(path: Path, overrides: dict[str, object]) -> Path:
    """Dotted ``overrides`` (as ``tiny_overrides`` returns them) written as a nested YAML config at ``path``."""
    import yaml

    data: dict[str, object] = {}
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})  # type: ignore[assignment]
        node[leaf] = value
    path.write_text(yaml.safe_dump(data))
    return path
