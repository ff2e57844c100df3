"""Shared helpers for the controller suites: run specs, probe driving, a threaded HTTP server."""

from __future__ import annotations

import base64
import uuid

import numpy as np

from adwin.controller.schemas import OfferIn, PolicyIn, ProbeOfferItem, ProbeReportIn, RunIn

CANDIDATES = [4, 8, 16]
MAX_LEN = 32


def run_spec(**overrides: object) -> RunIn:
    """A small adwin run with a unique id; ``policy=`` may be a dict of PolicyIn fields."""
    policy = overrides.pop("policy", {"candidates": CANDIDATES, "max_len": MAX_LEN})
    fields: dict = {
        "run_id": f"t-{uuid.uuid4().hex[:10]}",
        "policy": PolicyIn(**policy),  # type: ignore[arg-type]
        "probe_batch_size": 2,
        "offers_per_step": 8,
        "lookahead": 1,
    }
    fields.update(overrides)
    return RunIn(**fields)


def offers(step: int, n: int, *, prefix: str = "s", prompts: int | None = None, version: int | None = None) -> OfferIn:
    return OfferIn(
        step=step,
        offers=[
            ProbeOfferItem(
                sample_id=f"{prefix}{i}",
                prompt_id=f"p{i % (prompts or n)}",
                response_len=3,
                version=step if version is None else version,
            )
            for i in range(n)
        ],
    )


def finish(api: object, run_id: str, probe_id: str, step: int = 1, **kw: object) -> object:
    report = ProbeReportIn(probe_id=probe_id, step=step, tokens_added=5, version=step, finished=True, **kw)  # type: ignore[arg-type]
    return api.report_probe(run_id, report)  # type: ignore[attr-defined]


def ready_batch(api: object, run_id: str, n: int = 2, step: int = 0) -> object:
    """Offer and finish ``n`` probes at ``step``; the probe batch the controller then hands out."""
    acc = api.offer_probes(run_id, offers(step, n, prefix=f"b{step}-")).accepted  # type: ignore[attr-defined]
    for pid in acc:
        finish(api, run_id, pid)
    return api.next_probe_batch(run_id)  # type: ignore[attr-defined]


def sketch_b64(arr: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(arr, dtype="<f4").tobytes()).decode()
