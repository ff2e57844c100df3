"""Teachers in process: transformers models scoring the realized tokens of prompt+response rows.

A teacher scores ``log q(input_ids[b, i])`` from its full logits at ``i - 1``
(``adwin.objectives.losses.token_logprobs``), one forward pass per distinct checkpoint, and gives the full logits
to the dense losses. The other scorers (``adwin.teacher.vllm``, ``adwin.teacher.served``) have this interface
without full logits; ``adwin.teacher.load.load_teachers`` picks one by ``model.teacher_backend``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from adwin.objectives.losses import token_logprobs
from adwin.teacher.checkpoints import check_tokenizers, load_model, one_per_checkpoint, teacher_tokenizers
from adwin.teacher.routing import RoutedTeachers, check_row_routes, rows_per_model


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
        return self._per_teacher(input_ids, attention_mask, routes, lambda lg, ids: token_logprobs(lg, ids).float())

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str]) -> torch.Tensor:
        """Full teacher logits (B, L, V) in the model's raw layout, for the dense losses."""
        return self._per_teacher(input_ids, attention_mask, routes, lambda lg, ids: lg.float())

    def _per_teacher(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str],
                     fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        check_row_routes(routes, input_ids.shape[0])
        out: torch.Tensor | None = None
        for model, rows in rows_per_model(self.models, routes):  # one forward pass per model, not per route
            dev = next(model.parameters()).device
            ids = input_ids[rows].to(dev)
            logits = model(input_ids=ids, attention_mask=attention_mask[rows].to(dev)).logits  # (b, L, V_teacher)
            part = fn(logits[..., : self.vocab] if self.vocab else logits, ids).cpu()
            if out is None:
                out = torch.zeros((input_ids.shape[0], *part.shape[1:]), dtype=part.dtype)
            out[rows] = part
        assert out is not None
        return out
