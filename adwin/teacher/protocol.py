"""The OpenAI-compatible completions protocol of a served teacher: the requests adwin sends and how it reads
the answers (docs/teacher-server.md shows both in full).

A teacher scores the realized tokens of a token-id prompt (prompt + response): for every position ``j >= 1``
of a sequence ``seq``, ``log q(seq[j] | seq[:j])``, and the top-k of that distribution where the loss needs it.
Two request forms give this, both on ``POST {base}/completions``:

* ``prompt_logprobs`` (vLLM): ``"prompt_logprobs": k``; the answer's ``choices[i].prompt_logprobs`` is a list as
  long as the prompt, ``None`` at position 0, then ``{"<token id>": {"logprob", "rank", "decoded_token"}}``
  holding the top-k and the realized token (whatever its rank).
* ``echo`` (the legacy OpenAI form other servers speak): ``"echo": true, "logprobs": k``; the answer's
  ``choices[i].logprobs`` has ``tokens``, ``token_logprobs`` (``None`` at position 0) and ``top_logprobs``
  (one dict per position). Top-k needs token ids as keys (``"token_id:N"``, vLLM's
  ``return_tokens_as_token_ids``); a server that keys them by text gives realized tokens only.

Every answer is checked before a number is used: a missing or extra choice, a list of the wrong length, a
score for a token that is not the prompt's (a different tokenizer or a re-tokenized prompt), a NaN or a
positive logprob raise ``TeacherAnswerError`` naming the field, so nothing is trained on a partial or
mismatched answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

Protocol = Literal["prompt_logprobs", "echo"]
PROTOCOLS: tuple[Protocol, ...] = ("prompt_logprobs", "echo")
TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling of a token when return_tokens_as_token_ids is set
# a logprob is <= 0; servers round (bf16 logits, float formatting), so a hair above 0 is still a probability of 1
MAX_LOGPROB = 1e-4


class TeacherAnswerError(ValueError):
    """A teacher server's answer that cannot be trained on; ``field`` names where, e.g. ``choices[2].prompt_logprobs[7]``."""

    def __init__(self, url: str, field: str, problem: str) -> None:
        super().__init__(f"teacher server {url}: {field}: {problem}")
        self.url, self.field = url, field


@dataclass
class ScoredRow:
    """One sequence's teacher scores for positions ``j = 1 .. n-1`` (position 0 has no predictor)."""

    realized: list[float]  # (n-1,) log q(seq[j] | seq[:j])
    topk_ids: list[list[int]]  # (n-1, <=k) by rank; empty rows when no top-k was asked
    topk_logprobs: list[list[float]]  # (n-1, <=k)
    tokens: list[str | None]  # (n-1,) the server's spelling of seq[j] (the tokenizer check), None where not given


def completion_request(model: str, prompts: Sequence[Sequence[int]], protocol: Protocol, k: int,
                       max_tokens: int) -> dict[str, Any]:
    """The body of one scoring request: ``prompts`` are whole sequences (prompt + response token ids).

    ``k``: top-k tokens per position (0: the realized tokens only; 1 is asked for then, the smallest count
    every server accepts). The logprobs are the teacher's raw distribution at temperature 1."""
    body: dict[str, Any] = {"model": model, "prompt": [[int(t) for t in p] for p in prompts],
                            "max_tokens": max_tokens, "temperature": 1.0, "n": 1, "stream": False}
    if protocol == "prompt_logprobs":
        body["prompt_logprobs"] = max(k, 1)
    else:
        body |= {"echo": True, "logprobs": max(k, 1)}
        if k > 0:  # top-k keys must be ids, not text
            body["return_tokens_as_token_ids"] = True
    return body


def parse_completion(url: str, body: Any, seqs: Sequence[Sequence[int]], protocol: Protocol, k: int, *,
                     vocab_size: int | None = None) -> list[ScoredRow]:
    """The answer to ``completion_request(.., seqs, protocol, k, ..)``: one ``ScoredRow`` per sequence, in order.
    ``vocab_size``: top-k ids must be below it (they index the student's logits)."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        raise TeacherAnswerError(url, "choices", "the answer has no choices list")
    by_index: dict[int, dict[str, Any]] = {}
    for i, choice in enumerate(body["choices"]):
        index = choice.get("index") if isinstance(choice, dict) else None
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(seqs) or index in by_index:
            raise TeacherAnswerError(url, f"choices[{i}].index", f"{index!r} is not a new prompt index below {len(seqs)}")
        by_index[index] = choice
    if len(by_index) != len(seqs):
        raise TeacherAnswerError(url, "choices", f"{len(by_index)} choices for {len(seqs)} prompts (n must be 1)")
    parse = _prompt_logprobs_row if protocol == "prompt_logprobs" else _echo_row
    rows = [parse(url, f"choices[{i}]", seq, by_index[i], k) for i, seq in enumerate(seqs)]
    if vocab_size is not None:
        for i, row in enumerate(rows):
            for j, ids in enumerate(row.topk_ids, start=1):
                if ids and max(ids) >= vocab_size:
                    raise TeacherAnswerError(url, f"choices[{i}].{_SCORES[protocol]}[{j}]", f"top-k token id "
                                             f"{max(ids)} is not below the student's vocabulary size {vocab_size}")
    return rows


_SCORES = {"prompt_logprobs": "prompt_logprobs", "echo": "logprobs.top_logprobs"}


def _logprob(url: str, field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TeacherAnswerError(url, field, f"{str(value)[:40]!r} is not a number")
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf
    if not math.isfinite(number) or number > MAX_LOGPROB:
        raise TeacherAnswerError(url, field, f"{str(value)[:40]} is not a finite log-probability (<= 0)")
    return number


def _token_id(url: str, field: str, key: Any) -> int:
    text = str(key)
    text = text[len(TOKEN_ID_PREFIX):] if text.startswith(TOKEN_ID_PREFIX) else text
    if not (text.isascii() and text.isdigit()):  # str.isdigit takes '²' and '٣', which int() refuses or reads
        raise TeacherAnswerError(url, field, f"key {text[:40]!r} is not a token id (top-k needs ids: use protocol "
                                 "prompt_logprobs, or a server that sets return_tokens_as_token_ids)")
    return int(text)


def _top(ranked: list[tuple[float, int, float]], k: int) -> tuple[list[int], list[float]]:
    """(sort key, id, logprob) entries -> the first ``k`` ids and logprobs by the key."""
    best = sorted(ranked)[:k]
    return [t for _, t, _ in best], [lp for _, _, lp in best]


def _prompt_logprobs_row(url: str, where: str, seq: Sequence[int], choice: dict[str, Any], k: int) -> ScoredRow:
    entries = choice.get("prompt_logprobs")
    field = f"{where}.prompt_logprobs"
    if not isinstance(entries, list):
        raise TeacherAnswerError(url, field, "missing: the server does not answer prompt_logprobs "
                                 "(set model.teacher_server.protocol: echo)")
    if len(entries) != len(seq):
        raise TeacherAnswerError(url, field, f"{len(entries)} entries for a {len(seq)}-token prompt")
    row = ScoredRow([], [], [], [])
    for j in range(1, len(seq)):
        entry, at = entries[j], f"{field}[{j}]"
        if not isinstance(entry, dict):
            raise TeacherAnswerError(url, at, "no scores for this position")
        realized = entry.get(str(int(seq[j])))
        if not isinstance(realized, dict):
            raise TeacherAnswerError(url, at, f"no score for the prompt's token {int(seq[j])}: the server scored "
                                     "other tokens (a different tokenizer, or a prompt it re-tokenized)")
        row.realized.append(_logprob(url, f"{at}.{int(seq[j])}.logprob", realized.get("logprob")))
        decoded = realized.get("decoded_token")
        row.tokens.append(decoded if isinstance(decoded, str) else None)
        if k:
            ranked = []
            for key, v in entry.items():
                lp = _logprob(url, f"{at}.{key}.logprob", v.get("logprob") if isinstance(v, dict) else None)
                rank = v.get("rank")
                if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
                    raise TeacherAnswerError(url, f"{at}.{key}.rank", f"{rank!r} is not a rank (1 = the argmax)")
                if rank is None or rank <= k:  # the realized token rides along at its own rank, maybe beyond k
                    ranked.append((float(rank) if rank is not None else -lp, _token_id(url, at, key), lp))
            ids, lps = _top(ranked, k)
            row.topk_ids.append(ids)
            row.topk_logprobs.append(lps)
    return row


def _echo_row(url: str, where: str, seq: Sequence[int], choice: dict[str, Any], k: int) -> ScoredRow:
    lp = choice.get("logprobs")
    field = f"{where}.logprobs"
    if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
        raise TeacherAnswerError(url, f"{field}.token_logprobs", "missing: the server does not echo the prompt's "
                                 "logprobs (set model.teacher_server.protocol: prompt_logprobs)")
    values, tokens = lp["token_logprobs"], lp.get("tokens")
    if len(values) < len(seq):
        raise TeacherAnswerError(url, f"{field}.token_logprobs", f"{len(values)} entries for a {len(seq)}-token prompt")
    if tokens is not None and (not isinstance(tokens, list) or len(tokens) < len(seq)):
        raise TeacherAnswerError(url, f"{field}.tokens", f"not a list of at least {len(seq)} tokens")
    top = lp.get("top_logprobs")
    if k and (not isinstance(top, list) or len(top) < len(seq)):
        raise TeacherAnswerError(url, f"{field}.top_logprobs", f"top-{k} needs one dict per prompt token")
    row = ScoredRow([], [], [], [])
    for j in range(1, len(seq)):
        row.realized.append(_logprob(url, f"{field}.token_logprobs[{j}]", values[j]))
        token = tokens[j] if tokens is not None else None
        if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX):
            if _token_id(url, f"{field}.tokens[{j}]", token) != int(seq[j]):
                raise TeacherAnswerError(url, f"{field}.tokens[{j}]", f"echoes {token!r} for the prompt's token "
                                         f"{int(seq[j])} (a different tokenizer, or a prompt it re-tokenized)")
            token = None  # an id, not a spelling: nothing for the tokenizer check to compare
        row.tokens.append(token if isinstance(token, str) else None)
        if k:
            at = f"{field}.top_logprobs[{j}]"
            if not isinstance(top[j], dict):  # type: ignore[index]
                raise TeacherAnswerError(url, at, "not a dict of token -> logprob")
            ranked = []
            for key, v in top[j].items():  # type: ignore[index]
                value = _logprob(url, f"{at}.{key}", v)
                ranked.append((-value, _token_id(url, at, key), value))  # no ranks in this form: by logprob
            ids, lps = _top(ranked, k)
            row.topk_ids.append(ids)
            row.topk_logprobs.append(lps)
    return row


def unpadded(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The token ids of right-padded rows, padding dropped. input_ids, attention_mask: (B, L)."""
    lengths = attention_mask.sum(dim=1).tolist()  # (B,)
    seqs = []
    for b, n in enumerate(lengths):
        if not bool(attention_mask[b, : int(n)].all()):
            raise ValueError(f"row {b}: teacher scoring needs right-padded rows (the attention mask has a hole)")
        seqs.append([int(t) for t in input_ids[b, : int(n)].tolist()])
    return seqs
