"""verl's v1 batches and the driver's plan: a prompt batch in (one row a prompt, ``rollout.n`` sessions each), the
probe copies as extra sessions, and the TransferQueue rows that come back split into training rows and probe copies.

verl's v1 trainer sends each prompt once (``uid``: the prompt's id) and its agent-loop worker runs the prompt's
sessions, storing each as the TransferQueue key ``{uid}_{session}_{i}``. The driver is asked row by row, as under the
legacy trainer: a prompt's sessions ``{uid}_{s}``, ``s < n``, are its rows. A prompt given ``c`` copies runs
``n + c`` sessions (verl's per-prompt ``__rollout_n__``); sessions ``n .. n + c - 1`` are the copies
(``SESSIONS`` tells the agent loop). Duck-typed on TensorDict columns: importing it needs no verl.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from adwin.trainer_adapters.asyncopd.items import StreamItem
from adwin.trainer_adapters.verl.driver import StepPlan, finish_reason, verl_item
from adwin.trainer_adapters.verl.fields import MAX_TOKENS, PROBE, PROMPT, SESSIONS, WINDOW

ROLLOUT_N = "__rollout_n__"  # verl's per-prompt session count (AgentLoopWorkerTQ._run_prompt)


def session_rows(uids: Sequence[str], n: int) -> list[tuple[str, str]]:
    """The step's rows as the driver asks them, ``(request_id, prompt_id)``: each prompt's ``n`` sessions."""
    return [(f"{uid}_{s}", str(uid)) for uid in uids for s in range(n)]


@dataclass(frozen=True)
class V1Plan:
    """A plan laid onto a v1 prompt batch: the sessions each prompt runs, and each copy's probe id by its session
    key ``{uid}_{session}``."""

    sessions: list[int]  # (P,) sessions per prompt: n + its copies
    probe_ids: dict[str, str]


def lay_plan(plan: StepPlan, uids: Sequence[str], n: int) -> V1Plan:
    """Which sessions of which prompt are the plan's copies: a copy of row ``i`` is a new session of prompt
    ``i // n`` (after its ``n`` training sessions)."""
    sessions = [n] * len(uids)
    probe_ids: dict[str, str] = {}
    for row, probe_id in zip(plan.probes, plan.probe_ids, strict=True):
        p = row // n
        probe_ids[f"{uids[p]}_{sessions[p]}"] = probe_id
        sessions[p] += 1
    return V1Plan(sessions, probe_ids)


def planned_columns(plan: StepPlan, laid: V1Plan, uids: Sequence[str], n: int) -> dict[str, list[Any]]:
    """The per-prompt columns the agent loop reads (one value a prompt row)."""
    k = len(uids)
    return {PROMPT: [str(u) for u in uids], MAX_TOKENS: [plan.window] * k, WINDOW: [plan.window] * k,
            PROBE: [False] * k, SESSIONS: [n] * k, ROLLOUT_N: list(laid.sessions)}


def session_key(key: str) -> str:
    """``{uid}_{session}`` of a TransferQueue key ``{uid}_{session}_{i}``."""
    return key.rsplit("_", 1)[0]


def split_keys(keys: Sequence[str], probe_ids: Mapping[str, str]) -> tuple[list[int], list[int]]:
    """Indices of the training rows and of the probe copies among a sampled batch's keys."""
    train, probes = [], []
    for i, key in enumerate(keys):
        (probes if session_key(key) in probe_ids else train).append(i)
    return train, probes


def _rows(column: Any) -> list[Any]:
    """A TransferQueue column as one tensor a row (variable-length columns come back nested)."""
    return list(column.unbind(0)) if getattr(column, "is_nested", False) else list(column)


def items_v1(fields: Mapping[str, Any], keys: Sequence[str], probe_ids: Mapping[str, str], window: int,
             max_len: int, version: int) -> list[StreamItem]:
    """Rows read back from TransferQueue (``fields``: ``prompts`` (S_p,), ``responses`` (S_r,), and with
    distillation ``teacher_logprobs`` (S_p + S_r, k) a row, unpadded, column ``c`` the teacher's log-probability of
    the token at ``c + 1``) as the hooks' items; ``keys`` name the rows, ``probe_ids`` tell copies apart."""
    prompts, responses = _rows(fields["prompts"]), _rows(fields["responses"])
    teacher = _rows(fields["teacher_logprobs"]) if "teacher_logprobs" in fields.keys() else [None] * len(keys)
    items = []
    for key, p, r, t in zip(keys, prompts, responses, teacher, strict=True):
        session = session_key(key)
        probe = session in probe_ids
        cap, n, lp = max_len if probe else window, int(r.shape[0]), int(p.shape[0])
        scored = None if t is None else t[lp - 1 : lp - 1 + n, 0].float().tolist()
        items.append(verl_item(probe_ids.get(session, session), key.split("_")[0], p.tolist(), r.tolist(), scored,
                               window, cap, probe, version, finish_reason(n, cap, max_len)))
    return items
