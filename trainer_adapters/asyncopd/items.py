"""The OPD cache item that flows through the AsyncOPD pipeline, and the stage protocols.

One ``StreamItem`` per request (one sample of one prompt). Rollout workers append tokens to it; in
keep-mode a weight sync in the middle of a request keeps its prefix, and the token index where the
generating version changes is recorded in ``version_breakpoints``. Per visited prefix the item caches
the realized token's behavior logprob and, for the multi-sample MC estimator, ``m`` actions drawn iid
from the behavior distribution with their behavior logprobs (AsyncOPD Appendix G, queue interface).
The teacher stage adds teacher logprobs; the learner recomputes everything under the current student.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class TokenOut:
    """One decoding step's output for one request."""

    token: int
    logprob: float  # behavior log p(token) under the generating weights
    eos: bool = False
    mc_actions: list[int] | None = None  # m actions sampled iid from the same distribution
    mc_logprobs: list[float] | None = None  # their behavior logprobs


@dataclass
class StreamItem:
    """A request while it is generated, then the completed OPD cache item (``hooks.StampedItem``)."""

    request_id: str
    seq: int  # submission order
    prompt_id: str
    prompt_ids: list[int]
    route: str
    window: int
    max_tokens: int
    is_probe: bool
    submitted_version: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    mc_actions: list[list[int]] = field(default_factory=list)  # (n_tokens, m)
    mc_logprobs: list[list[float]] = field(default_factory=list)  # (n_tokens, m)
    version_breakpoints: list[tuple[int, int]] = field(default_factory=list)
    finish_reason: str | None = None
    forced: bool = False
    force: bool = False  # set by the scheduler at a sync: complete this probe now
    teacher_logprobs: list[float] | None = None  # (n_tokens,) realized tokens
    teacher_mc_logprobs: list[list[float]] | None = None  # (n_tokens, m)
    extra: dict[str, Any] = field(default_factory=dict)
    group: int = -1  # the prompt group (one per PromptSpec drawn): OAPL's V is estimated over it
    answer: str | None = None  # the prompt's reference answer (OAPL's task reward)

    @property
    def response_len(self) -> int:
        return len(self.tokens)

    @property
    def behavior_version(self) -> int:
        """Version of the oldest token (staleness is measured from it)."""
        return self.token_versions[0] if self.token_versions else self.submitted_version

    @property
    def newest_version(self) -> int:
        return self.token_versions[-1] if self.token_versions else self.submitted_version

    def append(self, out: TokenOut, version: int) -> None:
        """Add one token sampled by weights ``version``; record a breakpoint where the version changes."""
        if self.token_versions and version != self.token_versions[-1]:
            self.version_breakpoints.append((len(self.tokens), version))
        self.tokens.append(int(out.token))
        self.logprobs.append(float(out.logprob))
        self.token_versions.append(version)
        if out.mc_actions is not None:
            if out.mc_logprobs is None or len(out.mc_logprobs) != len(out.mc_actions):
                raise ValueError("mc_actions need one behavior logprob each")
            self.mc_actions.append([int(a) for a in out.mc_actions])
            self.mc_logprobs.append([float(x) for x in out.mc_logprobs])


@dataclass(frozen=True)
class PromptSpec:
    """One prompt from the source; the feeder turns it into ``samples_per_prompt`` requests."""

    prompt_id: str
    prompt_ids: list[int]
    route: str = "default"
    answer: str | None = None


class StreamingEngine(Protocol):
    """A rollout worker's model snapshot, stepping requests that join and leave token by token (continuous
    batching). Not ``adwin.decode.engine.RolloutEngine``, which continues whole batches of contexts by a budget.
    Called only from its own worker thread."""

    version: int

    def load_weights(self, weights: Any, version: int) -> None:
        """Install the learner's weights ``version``; any attention/prefix cache must be reset."""
        ...

    def step(self, items: Sequence[StreamItem]) -> list[TokenOut | None]:
        """One decoding step for each item: the next token, or None when the item makes no progress."""
        ...


class TeacherScorer(Protocol):
    def score(self, items: list[StreamItem]) -> None:
        """Fill ``teacher_logprobs`` (and ``teacher_mc_logprobs`` when MC actions are cached) in place."""
        ...


class Learner(Protocol):
    def update(self, items: list[StreamItem], version: int) -> dict[str, float]:
        """One learner update on ``B`` training items; ``version`` = updates applied before it."""
        ...

    def weights(self) -> Any:
        """A snapshot of the current weights for the rollout workers (must not alias live tensors)."""
        ...
