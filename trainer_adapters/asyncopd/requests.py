"""The feeder's requests, in submission order, and what a checkpoint keeps of those not trained on yet.

Each prompt drawn from the source becomes ``samples_per_prompt`` requests of one prompt group. A request is
*outstanding* from its submission until the dispatcher is done with it (consumed by an update, discarded
with its group, or a completed probe). A checkpoint (``state_dict``) records the outstanding training
requests and the drawn requests not submitted yet, in submission order: a resumed run submits them again
first, with their request ids, and generates them from scratch under the checkpoint's weights; the prompt
source continues after the last prompt drawn (its position is the run state's ``prompts``). Outstanding
probes are listed apart (``dropped_probes``): a probe is never trained on, so the resumed run reports them
dropped to the controller instead of generating them again (docs/decisions.md, "Resuming AsyncOPD").
"""

from __future__ import annotations

import dataclasses
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adwin.trainer_adapters.asyncopd.items import PromptSpec


@dataclass(frozen=True)
class Request:
    """One sample of one prompt; ``closes_group``: the last request of its group this stream submits (the
    feeder then knows how many training requests the group has)."""

    seq: int  # submission order; -1 until the stream hands it out
    spec: PromptSpec
    sample: int
    group: int
    closes_group: bool

    @property
    def request_id(self) -> str:
        return f"r{self.seq}-{self.spec.prompt_id}-{self.sample}"


class RequestStream:
    """Requests for the feeder: replayed ones first, then new prompts' (thread-safe: the feeder draws, the
    dispatcher marks requests done)."""

    def __init__(self, prompts: Callable[[], PromptSpec], samples_per_prompt: int) -> None:
        self.prompts, self.samples_per_prompt = prompts, samples_per_prompt
        self._queue: deque[Request] = deque()  # drawn, not submitted
        self._outstanding: dict[int, tuple[Request, bool]] = {}  # seq -> (request, is a probe)
        self._next_seq = 0
        self._next_group = 0
        self._lock = threading.Lock()

    def next(self) -> Request:
        with self._lock:
            if not self._queue:
                spec, group = self.prompts(), self._next_group
                self._next_group += 1
                n = self.samples_per_prompt
                self._queue.extend(Request(-1, spec, k, group, k == n - 1) for k in range(n))
            req = self._queue.popleft()
            if req.seq < 0:
                req = dataclasses.replace(req, seq=self._next_seq)
                self._next_seq += 1
            return req

    def submitted(self, req: Request, is_probe: bool) -> None:
        with self._lock:
            self._outstanding[req.seq] = (req, is_probe)

    def done(self, *seqs: int) -> None:
        with self._lock:
            for seq in seqs:
                self._outstanding.pop(seq, None)

    def state_dict(self) -> dict[str, Any]:
        """What to replay and which probes to drop; call it while the feeder is paused (a consistent cut)."""
        with self._lock:
            waiting = [self._outstanding[s] for s in sorted(self._outstanding)]
            replay = [r for r, probe in waiting if not probe] + list(self._queue)
            return {"replay": [_as_dict(r) for r in replay],
                    "dropped_probes": [r.request_id for r, probe in waiting if probe],
                    "next_seq": self._next_seq, "next_group": self._next_group}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        replay = [_from_dict(d) for d in state["replay"]]
        last = {r.group: i for i, r in enumerate(replay)}  # a group closes at its last replayed request
        with self._lock:
            self._queue = deque(dataclasses.replace(r, closes_group=last[r.group] == i) for i, r in enumerate(replay))
            self._outstanding.clear()
            self._next_seq, self._next_group = int(state["next_seq"]), int(state["next_group"])


def _as_dict(r: Request) -> dict[str, Any]:
    return dataclasses.asdict(r)


def _from_dict(d: dict[str, Any]) -> Request:
    return Request(int(d["seq"]), PromptSpec(**d["spec"]), int(d["sample"]), int(d["group"]), bool(d["closes_group"]))
