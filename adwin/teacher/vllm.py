"""Teacher scoring on vLLM with ``prompt_logprobs``: top-k for ``forward_kl_topk``, or the realized tokens'
logprobs for the sampled reverse-KL estimators (``reverse_kl_pg``; ``reverse_kl_mc`` needs the logprobs of
actions that are not in the sequence, which ``prompt_logprobs`` cannot give: score those with the HF teacher).

``VLLMTeacher.score_rows`` scores whole right-padded rows for ``model.teacher_backend: vllm``
(``EngineTeachers``: teachers keyed by route, as ``adwin.teacher.local.Teachers``).

UNTESTED ON HARDWARE (no GPU while writing it); ``scores_to_tensors`` and the parsing are unit-tested on
CPU with stand-in outputs. One request per sequence (prompt + response) with ``max_tokens=1`` and
``prompt_logprobs=k``: vLLM returns, for every position ``i >= 1``, a ``{token_id: Logprob}`` dict holding
the top-k tokens *and* the realized token ``seq[i]`` (each with its ``rank``), computed from the
teacher's raw logits given ``seq[:i]``. That is exactly the layout ``adwin.objectives.losses`` uses: values aligned
with ``input_ids``, position 0 has no predictor. The engine must allow ``max_logprobs >= k``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adwin.backends import require_vllm
from adwin.decode.vllm import engine_kwargs
from adwin.teacher.checkpoints import check_tokenizers, one_per_checkpoint, teacher_tokenizers
from adwin.teacher.protocol import unpadded
from adwin.teacher.routing import RoutedTeachers, check_row_routes, rows_per_model
from adwin.teacher.scoring import ListedRow, listed_scores


@dataclass
class TeacherScores:
    """One sequence's response-token scores (response position ``j`` = sequence position ``n_prompt + j``)."""

    realized: list[float]  # (n_resp,) teacher logprob of each realized response token
    topk_ids: list[list[int]]  # (n_resp, k) by rank; shorter rows when the engine returned fewer
    topk_logprobs: list[list[float]]  # (n_resp, k)


def parse_prompt_logprobs(seq: Sequence[int], n_prompt: int, prompt_logprobs: Sequence[dict[int, Any] | None],
                          k: int) -> TeacherScores:
    """``prompt_logprobs`` of one request -> the response positions' realized and top-k teacher logprobs."""
    if len(prompt_logprobs) != len(seq):
        raise ValueError(f"{len(seq)} tokens but {len(prompt_logprobs)} prompt_logprobs entries")
    if n_prompt < 1:
        raise ValueError("the prompt needs at least one token: position 0 has no teacher prediction")
    realized: list[float] = []
    ids: list[list[int]] = []
    lps: list[list[float]] = []
    for i in range(n_prompt, len(seq)):
        entry = prompt_logprobs[i]
        if entry is None or int(seq[i]) not in entry:
            raise ValueError(f"no teacher logprob for position {i} (token {seq[i]})")
        realized.append(float(entry[int(seq[i])].logprob))
        ranked = sorted(((lp.rank if lp.rank is not None else math.inf, tok, lp.logprob) for tok, lp in entry.items()))
        top = [(tok, float(lp)) for rank, tok, lp in ranked if rank <= k][:k]  # the realized token only if in top-k
        ids.append([t for t, _ in top])
        lps.append([x for _, x in top])
    return TeacherScores(realized, ids, lps)


def scores_to_tensors(scores: Sequence[TeacherScores], n_prompts: Sequence[int], width: int,
                      k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded tensors aligned with ``input_ids`` of width ``width``:
    realized (B, L), top-k ids (B, L, k) and top-k logprobs (B, L, k). Unfilled top-k slots get id 0 and
    logprob ``-inf`` (``forward_kl_topk`` counts them as q = 0); non-response positions are 0."""
    listed = listed_scores([ListedRow(n_p, s.realized, s.topk_ids, s.topk_logprobs)
                            for s, n_p in zip(scores, n_prompts, strict=True)], width, k)
    assert listed.topk_ids is not None and listed.topk_logprobs is not None
    return listed.realized, listed.topk_ids, listed.topk_logprobs


class VLLMTeacher:
    """A teacher behind a vLLM engine. ``llm``: a ``vllm.LLM`` (or a stand-in in tests)."""

    def __init__(self, llm: Any, topk: int = 20, sampling_params: Callable[..., Any] | None = None) -> None:
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        self.llm, self.topk, self._params = llm, topk, sampling_params

    @classmethod
    def load(cls, model_path: str, topk: int = 20, **engine_kw: Any) -> VLLMTeacher:
        vllm = require_vllm("model.teachers")
        engine_kw.setdefault("max_logprobs", max(20, topk))
        kw = engine_kwargs(model_path, **engine_kw)
        kw.pop("logprobs_mode")  # prompt logprobs come from raw logits either way; teacher at temperature 1
        return cls(vllm.LLM(**kw), topk, vllm.SamplingParams)

    def score(self, prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]]) -> list[TeacherScores]:
        make = self._params or require_vllm("model.teachers").SamplingParams
        params = make(max_tokens=1, temperature=1.0, prompt_logprobs=self.topk)
        seqs = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids, strict=True)]
        outs = self.llm.generate([{"prompt_token_ids": s} for s in seqs], params, use_tqdm=False)
        return [parse_prompt_logprobs(s, len(p), o.prompt_logprobs, self.topk)
                for s, p, o in zip(seqs, prompt_ids, outs, strict=True)]

    def score_rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Teacher logprob of every realized token of right-padded rows, as ``Teachers.score`` lays it out.

        input_ids, attention_mask: (B, L) -> (B, L) float32: position ``i >= 1`` of row ``b`` holds
        ``log q(input_ids[b, i] | input_ids[b, :i])``; position 0 (no predictor) and padding hold 0.
        """
        seqs = unpadded(input_ids, attention_mask)
        scoreable = [b for b, s in enumerate(seqs) if len(s) > 1]  # position 0 has no predictor
        scores = self.score([seqs[b][:1] for b in scoreable], [seqs[b][1:] for b in scoreable]) if scoreable else []
        by_row = dict(zip(scoreable, scores, strict=True))
        return listed_scores([ListedRow(1, by_row[b].realized if b in by_row else []) for b in range(len(seqs))],
                             input_ids.shape[1]).realized


class EngineTeachers(RoutedTeachers):
    """Teachers behind vLLM engines (``model.teacher_backend: vllm``), keyed by route like ``Teachers``:
    realized-token logprobs from prompt logprobs, no full logits (``dense`` is False; the config refuses
    the losses that need them). ``models``: route -> an engine with ``score_rows`` (a ``VLLMTeacher``)."""

    dense = False

    @classmethod
    def load(cls, paths: Mapping[str, str | Path], student_tok: object, student_vocab_size: int,
             dtype: str = "float32", gpu_memory: float = 0.3, max_model_len: int | None = None) -> EngineTeachers:
        """One engine per distinct checkpoint; tokenizers are checked against the student's first (from the
        folders' tokenizer and config files: no weights are loaded before the check)."""
        from transformers import AutoConfig

        sizes = {k: int(AutoConfig.from_pretrained(str(p)).vocab_size) for k, p in paths.items()}
        check_tokenizers(student_tok, teacher_tokenizers(paths), student_vocab_size, sizes)
        return cls(one_per_checkpoint(paths, lambda p: VLLMTeacher.load(
            str(p), topk=1, dtype=dtype, gpu_memory_utilization=gpu_memory, max_model_len=max_model_len)))

    @torch.no_grad()
    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str]) -> torch.Tensor:
        """As ``Teachers.score``: (B, L) right-padded rows -> (B, L) float32, one engine call per engine."""
        check_row_routes(routes, input_ids.shape[0])
        out = torch.zeros(input_ids.shape, dtype=torch.float32)
        for engine, rows in rows_per_model(self.models, routes):
            out[rows] = engine.score_rows(input_ids[rows].cpu(), attention_mask[rows].cpu())
        return out

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str]) -> torch.Tensor:
        raise ValueError("model.teacher_backend: 'vllm' gives realized-token logprobs only, no full logits; set "
                         "model.teacher_backend: hf for the dense losses")
