"""Teachers in process: transformers models scoring the realized tokens of prompt+response rows.

A teacher scores ``log q(input_ids[b, i])`` from its logits at ``i - 1`` on the student's columns
(``adwin.teacher.scoring``, the one scoring path), one forward pass per distinct checkpoint; it gives top-k and MC
actions' logprobs too, and the full logits to the dense losses. The other scorers (``adwin.teacher.vllm``, ``adwin.teacher.served``) have this interface
without full logits; ``adwin.teacher.load.load_teachers`` picks one by ``model.teacher_backend``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from adwin.teacher.checkpoints import check_tokenizers, load_model, one_per_checkpoint, teacher_tokenizers
from adwin.teacher.routing import RoutedTeachers, check_row_routes, rows_per_model
from adwin.teacher.scoring import ScoredTokens, score_rows, teacher_logits


class Teachers(RoutedTeachers):
    """One or more frozen teachers keyed by route; a single teacher scores every route."""

    dense = True  # full logits available (dense losses, the drift diagnostics)

    def __init__(self, models: Mapping[str, torch.nn.Module], vocab: int | None = None) -> None:
        """``vocab``: the student's output width. A teacher padded wider (Qwen2.5-7B's 152,064 rows against
        1.5B's 151,936) is read on those columns only: the rest are padding beyond the shared tokenizer
        (``check_tokenizers``), so dense losses, top-k and realized-token logprobs share the student's support."""
        super().__init__(models)
        self.vocab = vocab
        for m in self.models.values():
            m.eval()
            m.requires_grad_(False)

    @classmethod
    def load(cls, paths: Mapping[str, str | Path], student_tok: object, student_vocab_size: int,
             dtype: str = "float32", device: str = "cpu") -> Teachers:
        """Load every teacher and check its tokenizer against the student's before any compute."""
        models = one_per_checkpoint(paths, lambda p: load_model(p, dtype, device))
        sizes = {k: int(m.config.vocab_size) for k, m in models.items()}
        check_tokenizers(student_tok, teacher_tokenizers(paths), student_vocab_size, sizes)
        return cls(models, vocab=student_vocab_size)

    @torch.no_grad()
    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str]) -> torch.Tensor:
        """Teacher log-probability of each realized token, aligned with ``input_ids``.

        input_ids, attention_mask: (B, L) -> (B, L) float32 (0 at position 0). Rows are grouped by
        teacher so that each teacher runs one forward pass.
        """
        return self._scored(input_ids, attention_mask, routes).realized

    @torch.no_grad()
    def topk(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str],
             k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As ``ServedTeachers.topk``: realized logprobs (B, L), top-``k`` ids (B, L, k) and logprobs (B, L, k),
        taken on the teacher's device a chunk of positions at a time (``adwin.teacher.scoring``)."""
        scored = self._scored(input_ids, attention_mask, routes, k=k)
        assert scored.topk_ids is not None and scored.topk_logprobs is not None
        return scored.realized, scored.topk_ids, scored.topk_logprobs

    @torch.no_grad()
    def actions(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str],
                action_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Realized logprobs (B, L) and the logprobs (B, L, m) of ``action_ids`` (B, L, m, aligned with
        ``input_ids``; negative ids read token 0), from one forward pass per teacher."""
        scored = self._scored(input_ids, attention_mask, routes, actions=action_ids)
        assert scored.action_logprobs is not None
        return scored.realized, scored.action_logprobs

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str]) -> torch.Tensor:
        """Full teacher logits (B, L, V) in the model's raw layout, float32 on the host, for the dense losses."""
        check_row_routes(routes, input_ids.shape[0])
        out: dict[str, torch.Tensor] = {}
        for model, rows in rows_per_model(self.models, routes):  # one forward pass per model, not per route
            part = teacher_logits(model, input_ids[rows], attention_mask[rows], vocab=self.vocab)  # (b, L, V)
            _place(out, "logits", rows, part.float().cpu(), input_ids.shape[0])
        return out["logits"]

    def _scored(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str], *, k: int = 0,
                actions: torch.Tensor | None = None) -> ScoredTokens:
        check_row_routes(routes, input_ids.shape[0])
        out: dict[str, torch.Tensor] = {}
        for model, rows in rows_per_model(self.models, routes):  # one forward pass per model, not per route
            part = score_rows(model, input_ids[rows], attention_mask[rows], vocab=self.vocab, k=k,
                              actions=None if actions is None else actions[rows])
            for name, value in vars(part).items():
                if value is not None:
                    _place(out, name, rows, value, input_ids.shape[0])
        return ScoredTokens(**out)


def _place(out: dict[str, torch.Tensor], name: str, rows: torch.Tensor, part: torch.Tensor, n_rows: int) -> None:
    """Put one model's rows of a (b, ...) result into the batch's (B, ...) tensor ``out[name]``."""
    if name not in out:
        out[name] = torch.zeros((n_rows, *part.shape[1:]), dtype=part.dtype)
    out[name][rows] = part
