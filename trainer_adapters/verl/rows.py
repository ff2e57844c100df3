"""verl's batches (``DataProto``) and the driver's plan: probe copies in, ``VerlItem`` records out.

Duck-typed on ``DataProto`` (``non_tensor_batch``, ``batch``, ``select_idxs``, ``slice``, ``concat``), so importing
it needs no verl. Layout read back (verl's agent-loop output): ``prompts`` (B, Lp) left-padded, ``responses``
(B, Lr) right-padded, ``attention_mask`` (B, Lp + Lr), and with distillation ``teacher_logprobs`` (B, Lp + Lr, k)
where column ``c`` holds the teacher's log-probability of the token at column ``c + 1`` (vLLM's prompt logprobs
shifted by one; ``k = 1`` for verl's single-sample estimators, the realized token first).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from adwin.trainer_adapters.asyncopd.items import StreamItem
from adwin.trainer_adapters.verl.driver import StepPlan, finish_reason, verl_item
from adwin.trainer_adapters.verl.fields import MAX_TOKENS, PROBE, PROMPT, REQUEST, WINDOW, scalar


def _column(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def planned_batch(gen_batch: Any, plan: StepPlan, request_ids: Sequence[str], prompt_ids: Sequence[str],
                  max_len: int) -> Any:
    """``gen_batch`` with adwin's fields on every row (``prompt_ids``: each row's prompt, verl's ``uid``), followed
    by the plan's probe copies (at the horizon; a copy keeps its row's prompt)."""
    n = len(gen_batch)
    gen_batch.non_tensor_batch[PROMPT] = _column([str(p) for p in prompt_ids])
    gen_batch.non_tensor_batch[MAX_TOKENS] = _column([plan.window] * n)
    gen_batch.non_tensor_batch[PROBE] = _column([False] * n)
    gen_batch.non_tensor_batch[WINDOW] = _column([plan.window] * n)
    gen_batch.non_tensor_batch[REQUEST] = _column(list(request_ids))
    if not plan.probes:
        return gen_batch
    copies = gen_batch.select_idxs(np.asarray(plan.probes, dtype=np.int64))
    k = len(plan.probes)
    copies.non_tensor_batch[MAX_TOKENS] = _column([max_len] * k)
    copies.non_tensor_batch[PROBE] = _column([True] * k)
    copies.non_tensor_batch[REQUEST] = _column(list(plan.probe_ids))
    return type(gen_batch).concat([gen_batch, copies])


def items_of(output: Any, version: int, max_len: int) -> list[StreamItem]:
    """Every row of verl's generation output as the hooks' item (``verl_item``; probe copies marked by their field)."""
    prompts, responses = output.batch["prompts"], output.batch["responses"]  # (B, Lp), (B, Lr)
    mask = output.batch["attention_mask"]  # (B, Lp + Lr)
    keys = output.batch.keys()
    teacher = output.batch["teacher_logprobs"] if "teacher_logprobs" in keys else None  # (B, Lp + Lr, k)
    nt = output.non_tensor_batch
    lp = prompts.shape[1]
    items = []
    for b in range(len(output)):
        prompt_ids = prompts[b][mask[b, :lp].bool()].tolist()
        n = int(mask[b, lp:].sum())
        request = str(scalar(nt[REQUEST][b]))
        cap = int(scalar(nt[MAX_TOKENS][b]))
        scored = None if teacher is None else teacher[b, lp - 1 : lp - 1 + n, 0].float().tolist()
        items.append(verl_item(
            request, str(scalar(nt[PROMPT][b])), prompt_ids,
            responses[b, :n].tolist(), scored, int(scalar(nt[WINDOW][b])), cap, bool(scalar(nt[PROBE][b])), version,
            finish_reason(n, cap, max_len)))
    return items


def split(output: Any, n_train: int) -> tuple[Any, Any | None]:
    """verl's output as (the training rows, the probe copies or None): the copies follow the training rows."""
    if len(output) == n_train:
        return output, None
    return output.slice(0, n_train), output.slice(n_train, len(output))
