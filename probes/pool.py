"""The probe pool: unfinished prefixes continued toward full length off the critical path.

``Probe`` is the one probe record of every loop (the sync trainer's pool, the generic/TRL client's held
probes, an AsyncOPD completed probe request). Each probe keeps its tokens (prompt ids, response ids), the
student version that produced each response token (the version tag: number of optimizer steps applied
when the token was sampled), the behavior log-probability of each token at sampling time (None where the
sampler does not give them) and, when a pipeline's teacher stage scored it already, the teacher's
log-probabilities. ``probe_batch`` is the one builder of an audit's ``ProbeBatch`` from probes. The controller decides *what* happens to probes
(``ProbePlanOut``: how far active probes may extend, which must be force-completed); the executor
(``adwin.probes.async_executor``: inline, thread or Ray workers behind one interface, built by
``adwin.probes.executors.build_executor``) does it, applies results through ``ProbePool.apply`` and
``record_round`` and returns one ``ProbeReportIn`` per probe.

The pool knows nothing about models: extension goes through an ``Extender`` callable, so the same pool
serves an HF ``generate`` backend, a vLLM engine or a test double.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from adwin.audit.alignment import ProbeBatch
from adwin.controller.schemas import ProbeReportIn
from adwin.sampling.rollout import layout, response_values


@dataclass
class Extension:
    """What an extender returns for a batch of contexts (ragged, one entry per context)."""

    tokens: list[list[int]]
    logprobs: list[list[float]] | None  # None: the sampler gives no behavior logprobs
    finished: list[bool]  # emitted EOS
    # decode steps the round added to the run: its own call's (``Generation.decode_steps``); riding rows only
    # those by which they lengthened the rollout call they rode (``adwin.probes.riding``); 0 where unknown
    decode_steps: int = 0


class Extender(Protocol):
    def __call__(self, contexts: list[list[int]], budgets: list[int]) -> Extension:
        """Continue each context by at most ``budgets[i]`` tokens with the newest student weights."""
        ...


@dataclass
class Probe:
    probe_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    versions: list[int]  # one tag per response token
    behavior_logprobs: list[float] | None  # one per response token; None: unknown (e.g. a user's Extend)
    route: str = "default"
    submitted_step: int = 0  # the version it was offered at
    finished: bool = False  # EOS emitted, or the full horizon reached
    forced: bool = False
    prompt_id: str = ""  # groups rollouts of one prompt (stratified selection); "" = the probe id
    teacher_logprobs: list[float] | None = None  # one per response token, when a teacher stage scored it

    @property
    def oldest_version(self) -> int:
        return min(self.versions) if self.versions else self.submitted_step

    def staleness(self, version_now: int) -> int:
        """Optimizer steps between the oldest token's weights and ``version_now``."""
        return version_now - self.oldest_version

    def append(self, tokens: Sequence[int], logprobs: Sequence[float] | None, version: int) -> None:
        """Add tokens sampled by weights ``version``; ``logprobs`` None makes the behavior logprobs unknown."""
        if logprobs is not None and len(tokens) != len(logprobs):
            raise ValueError(f"probe {self.probe_id}: {len(tokens)} tokens but {len(logprobs)} logprobs")
        self.response_ids.extend(int(t) for t in tokens)
        if logprobs is None or self.behavior_logprobs is None:
            self.behavior_logprobs = None
        else:
            self.behavior_logprobs.extend(float(x) for x in logprobs)
        self.versions.extend([version] * len(tokens))
        self.teacher_logprobs = None  # the teacher scores the extended probe again


@dataclass
class RoundStats:
    extended: int = 0
    forced: int = 0
    completed: int = 0
    tokens: int = 0
    dropped: int = 0
    reports: list[ProbeReportIn] = field(default_factory=list)


class ProbePool:
    """Thread-safe store of probes by id; bounded by the full horizon ``max_response_len``."""

    def __init__(self, max_response_len: int) -> None:
        if max_response_len < 1:
            raise ValueError(f"max_response_len must be >= 1, got {max_response_len}")
        self.max_response_len = max_response_len
        self._probes: dict[str, Probe] = {}
        self._lock = threading.Lock()
        self.tokens_generated = 0  # probe tokens generated off the critical path, over the run

    def __len__(self) -> int:
        return len(self._probes)

    def __contains__(self, probe_id: str) -> bool:
        return probe_id in self._probes

    def get(self, probe_id: str) -> Probe:
        return self._probes[probe_id]

    def add(self, probe: Probe) -> None:
        n = len(probe.response_ids)
        if len(probe.versions) != n or any(v is not None and len(v) != n
                                           for v in (probe.behavior_logprobs, probe.teacher_logprobs)):
            raise ValueError(f"probe {probe.probe_id}: versions/logprobs must tag every response token")
        with self._lock:
            if probe.probe_id in self._probes:
                raise ValueError(f"probe {probe.probe_id!r} is already in the pool")
            self._probes[probe.probe_id] = probe

    def pop(self, probe_ids: Iterable[str]) -> list[Probe]:
        """Remove and return probes in the given order (the controller's submission order)."""
        with self._lock:
            return [self._probes.pop(pid) for pid in probe_ids]

    def snapshot(self) -> list[Probe]:
        """The probes held now, in insertion order (a copy of the list; the probes themselves are shared)."""
        with self._lock:
            return list(self._probes.values())

    def evict_complete_past(self, version_now: int, limit: int) -> int:
        """Drop finished probes whose staleness is past ``limit``: no audit may take them any more."""
        with self._lock:
            gone = [pid for pid, p in self._probes.items() if p.finished and p.staleness(version_now) > limit]
            for pid in gone:
                del self._probes[pid]
        return len(gone)

    def budget(self, probe: Probe, cap: int | None) -> int:
        """Tokens ``probe`` may add this round: up to ``cap`` (``None``: to the horizon)."""
        left = self.max_response_len - len(probe.response_ids)
        return max(0, left if cap is None else min(cap, left))

    def apply(self, probes: Sequence[Probe], ext: Extension, version: int, *, force: bool) -> dict[str, int]:
        """Append one extension per probe (tagged ``version``); returns tokens added by probe id.

        Called from one thread at a time (the trainer's); a probe that left the
        pool meanwhile (dropped) is skipped.
        """
        added: dict[str, int] = {}
        for i, p in enumerate(probes):
            if p.probe_id not in self._probes:
                continue
            p.append(ext.tokens[i], None if ext.logprobs is None else ext.logprobs[i], version)
            added[p.probe_id] = len(ext.tokens[i])
            at_horizon = len(p.response_ids) >= self.max_response_len
            # A forced probe is complete by definition once its one long extension returns.
            p.finished = bool(ext.finished[i]) or at_horizon or force
            p.forced = p.forced or force
            self.tokens_generated += len(ext.tokens[i])
        return added


Score = Callable[[torch.Tensor, torch.Tensor, list[str]], torch.Tensor]  # (ids, mask, routes) -> (B, L)


def probe_batch(probes: Sequence[Probe], pad_id: int, score: Score | None = None) -> ProbeBatch:
    """Right-padded rows (``layout``) of complete probes with their version tags, behavior logprobs (when every
    probe has them) and teacher logprobs: those a teacher stage stored on every probe, else ``score(input_ids,
    attention_mask, routes)``."""
    if not probes:
        raise ValueError("a probe batch needs at least one probe")
    rows = layout([p.prompt_ids for p in probes], [p.response_ids for p in probes], pad_id)
    behavior = None
    if all(p.behavior_logprobs is not None for p in probes):
        behavior = response_values(rows, [p.behavior_logprobs for p in probes])  # (B, L)
    versions = response_values(rows, [p.versions for p in probes], fill=-1, dtype=torch.long)  # (B, L)
    stored = [p.teacher_logprobs for p in probes]
    if all(t is not None for t in stored):
        teacher = response_values(rows, stored)  # (B, L), 0 off the response
    elif score is None:
        unscored = next(p.probe_id for p in probes if p.teacher_logprobs is None)
        raise ValueError(f"probe {unscored} reached the audit unscored and no teacher was given")
    else:
        with torch.no_grad():
            teacher = score(rows.input_ids, rows.attention_mask, [p.route for p in probes]).float()  # (B, L)
        teacher = teacher * rows.response_mask
    return ProbeBatch(rows.input_ids, rows.attention_mask, rows.response_mask, teacher,
                      behavior_logprobs=behavior, versions=versions)


def record_round(stats: RoundStats, probes: Sequence[Probe], added: dict[str, int], step: int, version: int,
                 *, force: bool) -> None:
    """Count one applied extension round into ``stats`` and add one report per probe."""
    for p in probes:
        n = added.get(p.probe_id, 0)
        stats.tokens += n
        stats.extended += int(n > 0)
        stats.forced += int(force)
        stats.completed += int(p.finished)
        stats.reports.append(ProbeReportIn(probe_id=p.probe_id, step=step, tokens_added=n, version=version,
                                           finished=p.finished, forced=force))
