"""One run shell for both schedulers: the synchronous trainer and the AsyncOPD pipeline write the same run folder
(checkpoints, their files, the export) and the same shell metrics in every row (CPU, tiny models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_fixtures import tiny_overrides

from adwin.config import load_config
from adwin.controller import Controller
from adwin.loop.parts import load_parts
from adwin.loop.trainer import train
from adwin.trainer_adapters.asyncopd.train import train_asyncopd

pytestmark = pytest.mark.timeout(300)

# what the shell adds to every row, whichever schedule trained
SHELL_KEYS = {"optim/lr", "time/wall", "optim/skipped_steps", "optim/consecutive_skipped", "rollout/sync_tokens",
              "rollout/sync_tokens_total", "rollout/full_equiv_tokens_total", "probe/tokens_total",
              "rollout/prompt_tokens", "window/current"}


def _run(tmp: Path, scheduler: str, **extra: object):
    ov = tiny_overrides(tmp, steps=2, name="run", checkpoint_every=1, scheduler=scheduler, **{
        "out_dir": str(tmp / scheduler), "eval.every": 1, "window.policy": "fixed", "window.window": 8, **extra})
    if scheduler == "asyncopd":
        ov |= {"asyncopd.rollout_workers": 1, "asyncopd.queue_depth": 0, "asyncopd.wait_timeout_s": 60}
    cfg = load_config(None, ov)
    fn = train_asyncopd if scheduler == "asyncopd" else train
    return fn(cfg, Controller(), load_parts(cfg))


def _layout(run_dir: Path) -> set[str]:
    """Every file of the run folder (the controller's working database and summary aside: the command writes
    those), relative to it."""
    return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file()} - {"controller.db"}


@pytest.mark.parametrize("extra", [{}, {"model.sharding": "fsdp"}, {"model.lora": {"r": 4, "alpha": 8}}],
                         ids=["replicated", "sharded", "lora"])
def test_both_schedulers_write_the_same_run_folder_through_the_shell(tmp_path: Path, extra: dict) -> None:
    if "model.lora" in extra:
        pytest.importorskip("peft")  # the lora extra
    sync, stream = _run(tmp_path, "sync", **extra), _run(tmp_path, "asyncopd", **extra)
    assert _layout(sync.run_dir) == _layout(stream.run_dir)
    assert sorted(p.name for p in stream.run_dir.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    # the exported student: the same folder, one from_pretrained loads
    assert sync.student_dir is not None and stream.student_dir is not None
    assert stream.student_dir.relative_to(stream.run_dir) == sync.student_dir.relative_to(sync.run_dir)
    assert (stream.student_dir / "config.json").is_file()
    for res in (sync, stream):
        rows = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [0, 1]
        for row in rows:  # eval.every 1: every row evaluates; the first also carries the start-of-run evaluation
            assert SHELL_KEYS <= row.keys() and "eval/accuracy" in row and "time/eval" in row, res.run_dir
        state = json.loads((res.run_dir / "checkpoint-2" / "state.json").read_text())
        assert state["sharding"] == extra.get("model.sharding", "ddp") and state["initial_eval"] == res.initial_eval
        assert res.totals["sync_tokens"] == rows[-1]["rollout/sync_tokens_total"]
