"""Metric sinks. Every step the trainer hands one flat dict with namespaced keys (``window/current``,
``loss/total``, ...) to each sink: JSONL in the run folder (always), stdout, wandb (offline or online)
and the controller (``report_step``, finite floats only).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO, runtime_checkable

if TYPE_CHECKING:
    from adwin.config import TrainConfig
    from adwin.controller.api import ControllerAPI

log = logging.getLogger(__name__)


@runtime_checkable
class MetricsLogger(Protocol):
    def log(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Finite numbers only (bools become 0/1): what the controller and plots accept."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        if isinstance(v, (bool, int, float)) and math.isfinite(float(v)):
            out[k] = float(v)
    return out


class JsonlLogger:
    """Appends ``{"step": t, **metrics}`` per line to ``metrics.jsonl``; writes ``config.json`` once."""

    def __init__(self, run_dir: str | Path, config: Mapping[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if config is not None:
            (self.run_dir / "config.json").write_text(json.dumps(config, indent=2, default=str))
        self.path = self.run_dir / "metrics.jsonl"
        self._fh: TextIO = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class StdoutLogger:
    """One compact line per step (``--log-stdout``); prints because stdout *is* the requested sink."""

    def __init__(self, stream: TextIO | None = None, keys: Sequence[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.keys = keys

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        items = [(k, metrics[k]) for k in (self.keys or sorted(metrics)) if k in metrics]
        text = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in items)
        self.stream.write(f"step {step} {text}\n")
        self.stream.flush()

    def close(self) -> None:
        pass


class WandbLogger:
    """wandb in ``offline`` (no network; sync later with ``wandb sync``) or ``online`` mode."""

    def __init__(self, mode: str, run_dir: str | Path, name: str, config: Mapping[str, Any]) -> None:
        import wandb

        self._wandb = wandb
        self.run = wandb.init(project="adwin", name=name, mode=mode, dir=str(run_dir), config=dict(config),
                              reinit="finish_previous")

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(numeric(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class ControllerLogger:
    """Sends each step's numeric metrics to the controller, where the dashboard reads them."""

    def __init__(self, controller: Any, run_id: str) -> None:
        self.controller = controller
        self.run_id = run_id

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        from adwin.controller.schemas import StepMetricsIn

        self.controller.report_step(self.run_id, StepMetricsIn(step=step, metrics=numeric(metrics)),
                                    idempotency_key=f"{self.run_id}-step-{step}")

    def close(self) -> None:
        pass


class MultiLogger:
    """Fans out to several sinks; a failing optional sink (wandb) is logged, never fatal to training."""

    def __init__(self, sinks: Sequence[MetricsLogger]) -> None:
        self.sinks = list(sinks)
        self.history: list[dict[str, Any]] = []

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.history.append({"step": step, **metrics})
        for sink in self.sinks:
            if isinstance(sink, WandbLogger):
                try:
                    sink.log(step, metrics)
                except Exception:  # noqa: BLE001 - a telemetry sink must not kill the run
                    log.warning("wandb logging failed at step %d", step, exc_info=True)
            else:
                sink.log(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_loggers(cfg: TrainConfig, run_dir: Path, controller: ControllerAPI, run_id: str) -> MultiLogger:
    """A run's sinks: the JSONL file and the controller, then stdout and W&B as ``logging`` asks."""
    resolved = cfg.model_dump(mode="json")
    sinks: list[Any] = [JsonlLogger(run_dir, resolved), ControllerLogger(controller, run_id)]
    if cfg.logging.stdout:
        sinks.append(StdoutLogger(keys=["window/current", "loss/total", "loss/teacher_kl", "eval/accuracy"]))
    if cfg.logging.wandb != "off":
        sinks.append(WandbLogger(cfg.logging.wandb, run_dir, cfg.name, resolved))
    return MultiLogger(sinks)
