"""Pending sketch ranks on disk, next to the SQLite file (``<db>.sketches/``).

A rank's (K+1, D) float32 sketch (384 KiB for 6 x 16384) must be durable before the rank is
acknowledged, so that a restarted service resumes a half-submitted audit. As a SQLite blob it costs
an overflow-page INSERT and a WAL commit of the same size on the audit-to-decision path; a plain file
(written to a temporary name, then renamed) costs a third of that. The row in ``audit_parts`` still
commits in the same transaction as the rank's acknowledgement; its ``payload`` is then empty and the
bytes live here. Durability is the store's (``synchronous=NORMAL``): both survive a killed process.
Files of decided audits are removed together with their rows (``next_probe_batch``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


class SketchFiles:
    """One file per (run, audit, rank): ``<hex run id>-<audit id>-<rank>.f32``, raw little-endian float32."""

    def __init__(self, db_path: str) -> None:
        self.root = Path(f"{db_path}.sketches")  # created with the first pending rank

    def path(self, run_id: str, audit_id: int, rank: int) -> Path:
        # hex: run ids may be "." or ".." (allowed by the schema) and must never become path parts
        return self.root / f"{run_id.encode().hex()}-{audit_id}-{rank}.f32"

    def write(self, run_id: str, audit_id: int, rank: int, sketch: np.ndarray) -> None:
        final = self.path(run_id, audit_id, rank)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = final.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(np.ascontiguousarray(sketch, dtype="<f4").data)
        os.replace(tmp, final)  # a reader never sees a half-written rank

    def read(self, run_id: str, audit_id: int, rank: int, shape: tuple[int, ...]) -> np.ndarray:
        return np.fromfile(self.path(run_id, audit_id, rank), dtype="<f4").reshape(shape)

    def remove(self, run_id: str, parts: list[tuple[int, int]]) -> None:
        """Remove the files of ``(audit_id, rank)`` parts; missing ones are fine."""
        for audit_id, rank in parts:
            self.path(run_id, audit_id, rank).unlink(missing_ok=True)
