"""Prompt groups for OAPL: the learner trains on whole groups, each sampled by one inference policy.

OAPL's value estimate ``V(x)`` (eq. 2) averages over a prompt's ``G`` rollouts and is only meaningful when
all of them come from one ``pi_inf``; Algorithm 1 therefore clears the buffer whenever the inference
policy is synced. ``GroupBuffer`` enforces both at the dispatcher: the feeder tags every training request
with its prompt's group and, once the group's last request is planned, says how many training requests
it has (a request that became a probe is not one); completed items are filed by group, and a group is
handed to the learner only when it is complete, none of its items was cut by a sync (``stale``) and every
token of every item was sampled by the inference version the workers hold now. Any other complete group
is discarded whole, so its permits come back and nothing of it is trained on.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from adwin.trainer_adapters.asyncopd.items import StreamItem


def group_version(items: Sequence[StreamItem]) -> int | None:
    """The one weights version that sampled every token of ``items``, or None when there are several
    (or an item was cut by a sync, or has no tokens)."""
    versions = {v for it in items for v in it.token_versions}
    if len(versions) != 1 or any(it.finish_reason == "stale" or not it.tokens for it in items):
        return None
    return next(iter(versions))


@dataclass
class GroupBuffer:
    """Thread-safe: the feeder calls ``expect``, the dispatcher ``add`` and ``take``."""

    _members: dict[int, list[StreamItem]] = field(default_factory=dict)
    _expected: dict[int, int] = field(default_factory=dict)
    _order: list[int] = field(default_factory=list)  # groups in the order their first item arrived
    _lock: threading.Lock = field(default_factory=threading.Lock)
    discarded_groups: int = 0
    discarded_items: int = 0
    discarded_tokens: int = 0

    def expect(self, group: int, size: int) -> None:
        """The feeder planned every request of ``group``: ``size`` of them are training requests."""
        with self._lock:
            if size > 0:
                self._expected[group] = size

    def add(self, item: StreamItem) -> None:
        if item.group < 0:
            raise ValueError(f"training item {item.request_id} has no prompt group")
        with self._lock:
            if item.group not in self._members:
                self._members[item.group] = []
                self._order.append(item.group)
            self._members[item.group].append(item)

    def take(self, n: int, version: int) -> tuple[list[list[StreamItem]] | None, list[StreamItem]]:
        """``n`` complete groups sampled by ``version`` (oldest first) or None while fewer are ready, and
        the items of every complete group that was discarded (their permits go back)."""
        with self._lock:
            ready: list[int] = []
            dropped: list[StreamItem] = []
            for g in list(self._order):
                members = self._members[g]
                if g not in self._expected or len(members) < self._expected[g]:
                    continue  # still in flight
                if group_version(members) == version:
                    ready.append(g)
                    continue
                dropped += members  # mixed, cut by a sync, or from an older inference policy
                self.discarded_groups += 1
                self._forget(g)
            self.discarded_items += len(dropped)
            self.discarded_tokens += sum(it.response_len for it in dropped)
            if len(ready) < n:
                return None, dropped
            groups = [self._members[g] for g in ready[:n]]
            for g in ready[:n]:
                self._forget(g)
            return groups, dropped

    def _forget(self, group: int) -> None:
        del self._members[group]
        del self._expected[group]
        self._order.remove(group)

    def pending(self) -> int:
        """Items filed and not yet taken or discarded."""
        with self._lock:
            return sum(len(m) for m in self._members.values())
