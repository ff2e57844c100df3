"""The built-in task's prompts, as the trainer takes them (``adwin.sampling.data.Prompt``): its training stream,
its evaluation problems and its answer checker (``data.task: builtin``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

from adwin.sampling.data import DataError, Prompt, check_stream_kind
from adwin.tasks.chain import ROUTES, check_answer
from adwin.tasks.suite import get_task


def builtin_prompts(n: int, seed: int, split: str, task: str = "chain") -> list[Prompt]:
    """Problems of a built-in task (``adwin.tasks.suite``), deterministic in ``seed``; every task draws
    the same problems (``chain-late`` skips the longest chains), its own answers."""
    return [
        Prompt(id=s.id, prompt=s.prompt, answer=s.answer, route=s.route)
        for s in get_task(task).samples(n, seed=seed, split=split)
    ]


class BuiltinPrompts:
    """The built-in task's training prompts: the seed's endless sequence of i.i.d. problems
    (``adwin.tasks.chain.iter_samples``), served in order. No pool sized by the run's steps, so a run extended
    with ``--resume --steps`` sees exactly the problems a straight run of the new length sees; the state is
    how many were served."""

    def __init__(self, seed: int, task: str = "chain") -> None:
        self.seed = seed
        self.task = task
        self.served = 0
        self._it = self._samples()

    def _samples(self) -> Iterator[Prompt]:
        return (Prompt(id=s.id, prompt=s.prompt, answer=s.answer, route=s.route)
                for s in get_task(self.task).iter_samples(self.seed, "train"))

    def next_batch(self, n: int) -> list[Prompt]:
        self.served += n
        return list(itertools.islice(self._it, n))

    def route_examples(self) -> list[Prompt]:
        # routes alternate in the stream; a task that skips some problems may break the alternation
        return list(itertools.islice(self._samples(), 8 * len(ROUTES)))

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "builtin", "seed": self.seed, "task": self.task, "served": self.served}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_stream_kind(state, "builtin")
        if int(state["seed"]) != self.seed:
            raise DataError(f"prompt stream state is for seed {state['seed']}, this run's seed is {self.seed}")
        if state.get("task", "chain") != self.task:
            raise DataError(f"prompt stream state is for task {state.get('task', 'chain')!r}, this run's task is "
                            f"{self.task!r} (data.builtin_task)")
        self.served = int(state["served"])
        self._it = itertools.islice(self._samples(), self.served, None)


def builtin_checker() -> Callable[[str, str], bool]:
    """The built-in task's answer checker."""
    return check_answer
