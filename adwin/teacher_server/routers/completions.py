"""``POST /v1/completions``: score token-id prompts (docs/teacher-server.md has the exact bodies).

The answer carries, per prompt, vLLM's ``prompt_logprobs`` when asked (``None`` at position 0, then the top-k and
the realized token with ``logprob``, ``rank`` and ``decoded_token``), and the legacy ``logprobs`` object
(``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``) over the prompt with ``echo`` and over
the generated token (``max_tokens: 1``, the argmax).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from fastapi import APIRouter, Request

from adwin.teacher_server.schemas import CompletionIn, error_responses
from adwin.teacher_server.scoring import RowScores
from adwin.teacher_server.service import TeacherService
from adwin.teacher_server.strict_json import StrictJSONRoute

router = APIRouter(prefix="/v1", tags=["completions"], route_class=StrictJSONRoute)
_IDS = itertools.count()


@router.post("/completions", responses=error_responses(400, 401, 404, 413, 503))
async def create_completion(body: CompletionIn, request: Request) -> dict[str, Any]:
    svc: TeacherService = request.app.state.teacher
    seqs = body.sequences()
    svc.check(body.model, seqs, body.max_tokens)
    k_prompt = svc.logprob_count("prompt_logprobs", body.prompt_logprobs)
    k_legacy = svc.logprob_count("logprobs", body.logprobs)
    rows = await asyncio.wrap_future(svc.batcher.submit(seqs, max(k_prompt, k_legacy)))
    choices = [_choice(svc, i, seq, row, body, k_prompt, k_legacy)
               for i, (seq, row) in enumerate(zip(seqs, rows, strict=True))]
    prompt_tokens = sum(len(s) for s in seqs)
    return {"id": f"cmpl-{next(_IDS)}", "object": "text_completion", "created": int(time.time()), "model": svc.name,
            "choices": choices, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": body.max_tokens * len(seqs),
                                          "total_tokens": prompt_tokens + body.max_tokens * len(seqs)}}


def _choice(svc: TeacherService, index: int, seq: list[int], row: RowScores, body: CompletionIn, k_prompt: int,
            k_legacy: int) -> dict[str, Any]:
    generated = [row.next_id] if body.max_tokens else []
    text = "".join(svc.decoded[t] for t in generated)
    out: dict[str, Any] = {"index": index, "text": text, "logprobs": None, "finish_reason": "length",
                           "stop_reason": None}
    if body.prompt_logprobs is not None:
        out["prompt_logprobs"] = _prompt_logprobs(svc, seq, row, k_prompt)
    if body.echo:
        out["text"] = "".join(svc.decoded[t] for t in seq) + text
    if body.logprobs is not None:
        out["logprobs"] = _legacy_logprobs(svc, seq, row, body, k_legacy)
    return out


def _prompt_logprobs(svc: TeacherService, seq: list[int], row: RowScores, k: int) -> list[dict[str, Any] | None]:
    entries: list[dict[str, Any] | None] = [None]
    for j in range(1, len(seq)):
        entry = {str(t): {"logprob": lp, "rank": r, "decoded_token": svc.decoded[t]}
                 for r, (t, lp) in enumerate(zip(row.top_ids[j - 1][:k], row.top_logprobs[j - 1][:k], strict=True), 1)}
        entry.setdefault(str(seq[j]), {"logprob": row.realized[j - 1], "rank": row.ranks[j - 1],
                                       "decoded_token": svc.decoded[seq[j]]})
        entries.append(entry)
    return entries


def _legacy_logprobs(svc: TeacherService, seq: list[int], row: RowScores, body: CompletionIn,
                     k: int) -> dict[str, Any]:
    """``tokens`` / ``token_logprobs`` / ``top_logprobs`` over the prompt (echo) and the generated token."""

    def spell(t: int) -> str:
        return f"token_id:{t}" if body.return_tokens_as_token_ids else svc.pieces[t]

    def top(j: int) -> dict[str, float]:  # distribution of position j + 1 (j = len(seq) - 1: the next token)
        return {spell(t): lp for t, lp in zip(row.top_ids[j][:k], row.top_logprobs[j][:k], strict=True)}

    ids: list[int] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    if body.echo:
        ids, values = list(seq), [None, *row.realized]
        tops = [None] + [top(j - 1) for j in range(1, len(seq))]
    if body.max_tokens:
        ids.append(row.next_id)
        values.append(row.next_logprob)
        tops.append(top(len(seq) - 1))
    tokens = [spell(t) for t in ids]
    offsets = list(itertools.accumulate((len(svc.decoded[t]) for t in ids[:-1]), initial=0)) if ids else []
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops if k else None, "text_offset": offsets}
