"""Routing: each sample names the teacher that scores it (``model.teachers`` keys; one teacher scores every route).

``RoutedTeachers`` is what every scorer (``Teachers``, ``EngineTeachers``, ``ServedTeachers``) holds: route -> the
model, engine or client that scores it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


class UnknownTeacher(ValueError):
    """A sample routes to a teacher key that is not configured."""


def route_of(keys: Sequence[str], key: str) -> str:
    """The teacher key that scores route ``key``: the only teacher, or the route's own."""
    if len(keys) == 1:
        return keys[0]
    if key not in keys:
        raise UnknownTeacher(f"no teacher for route {key!r}; model.teachers has {sorted(keys)}")
    return key


def rows_per_model(models: Mapping[str, Any], routes: Sequence[str]) -> list[tuple[Any, torch.Tensor]]:
    """``(model, row indices)`` per distinct model of ``routes`` (one route per row): routes that share a
    checkpoint are scored by one call."""
    keys = list(models)
    owner = [id(models[route_of(keys, r)]) for r in routes]
    by_id = {id(m): m for m in models.values()}
    return [(by_id[mid], torch.tensor([b for b, o in enumerate(owner) if o == mid], dtype=torch.long))
            for mid in dict.fromkeys(owner)]


def check_row_routes(routes: Sequence[str], n_rows: int) -> None:
    """One route per row of a scoring call."""
    if len(routes) != n_rows:
        raise ValueError(f"{len(routes)} routes for {n_rows} rows")


class RoutedTeachers:
    """Teachers keyed by route: ``models`` maps each route to what scores it (routes that share a checkpoint or
    a server share one)."""

    def __init__(self, models: Mapping[str, Any]) -> None:
        if not models:
            raise ValueError("model.teachers must name at least one teacher")
        self.models = dict(models)

    def route(self, key: str) -> str:
        return route_of(list(self.models), key)
