"""Teachers behind servers (``model.teacher_backend: server``): each routing key names a server URL.

``ServedTeachers`` has the ``Teachers`` interface the trainer, the probe side, the evaluation and the AsyncOPD
teacher stage call: ``score`` (realized-token logprobs, (B, L)) and ``topk`` (``forward_kl_topk``), with rows
of every route sent at once, one ``TeacherClient`` per distinct URL. It has no full logits (``dense`` is
False: the config refuses the losses that need them, and the drift diagnostics are off).

What is checked against a server at start-up (docs/decisions.md, "A teacher behind a server"), before any
compute: the served model (``GET /models``; a fragment of the URL names one of several), its context
(``max_model_len`` when listed) against prompt + horizon, and one scored probe sequence of token ids spread over
the student's vocabulary: the server must accept the student's largest id (its vocabulary is not smaller), it
must score exactly the ids sent (echoed ids or keys), and where it spells a token (``decoded_token``,
``tokens``) the spelling must be the student tokenizer's. A server cannot show its whole vocabulary, so
this is a sample: two tokenizers that agree on the probe's ids but differ elsewhere pass.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import torch

from adwin.teacher.checkpoints import TokenizerMismatch, one_per_checkpoint
from adwin.teacher.client import ClientSettings, TeacherClient, TeacherRefused, collect
from adwin.teacher.protocol import ScoredRow, unpadded
from adwin.teacher.routing import RoutedTeachers, check_row_routes, route_of
from adwin.teacher.scoring import ListedRow, ScoredTokens, listed_scores

log = logging.getLogger(__name__)

PROBE_IDS = 48  # token ids of the start-up probe, spread over the student's vocabulary
_MARKERS = str.maketrans({"\u2581": " ", "\u0120": " ", "\u010a": "\n"})  # SentencePiece / byte-level BPE spaces


def probe_ids(vocab_needed: int) -> list[int]:
    """Token ids spread evenly over ``[0, vocab_needed)``, the largest included (the vocabulary size check)."""
    step = max(1, vocab_needed // PROBE_IDS)
    return sorted(set(range(0, vocab_needed, step)) | {vocab_needed - 1})


def _spelling(text: str) -> str:
    return text.translate(_MARKERS).strip()


def check_spellings(route: str, url: str, student_tok: Any, seq: Sequence[int], row: ScoredRow) -> int:
    """Raise ``TokenizerMismatch`` when the server spells a probe token differently from the student's tokenizer.

    Spellings are compared without SentencePiece / byte-level space markers and surrounding whitespace;
    tokens that are blank or partial bytes (U+FFFD) on either side are not compared. Returns how many were."""
    compared = 0
    for j, server in enumerate(row.tokens, start=1):
        if server is None or "\ufffd" in server or not _spelling(server):
            continue
        tid = int(seq[j])
        forms = {_spelling(str(student_tok.convert_ids_to_tokens(tid))), _spelling(student_tok.decode([tid]))}
        forms = {f for f in forms if f and "\ufffd" not in f}
        if not forms:
            continue
        compared += 1
        if _spelling(server) not in forms:
            raise TokenizerMismatch(
                f"teacher {route!r} at {url} spells token id {tid} {server!r}, the student's tokenizer "
                f"{sorted(forms)[0]!r}: on-policy distillation needs a shared tokenizer (if the server only spells "
                "tokens differently, set model.teacher_server.check_tokenizer: false)")
    return compared


class ServedTeachers(RoutedTeachers):
    """Teachers behind OpenAI-compatible completion servers, keyed by route like ``Teachers``.
    ``models``: route -> ``TeacherClient`` (routes that name one URL share a client)."""

    dense = False

    @classmethod
    def load(cls, urls: Mapping[str, str], student_tok: Any, student_vocab_size: int, settings: ClientSettings, *,
             context: int | None = None, check_tokenizer: bool = True,
             transport: httpx.BaseTransport | None = None) -> ServedTeachers:
        """Connect to every server and check it (module docstring) before any compute. ``context``: prompt +
        response tokens a row may have; ``transport``: an httpx transport for tests."""
        clients = one_per_checkpoint(urls, lambda u: TeacherClient(str(u), settings, vocab_size=student_vocab_size,
                                                                   transport=transport))
        needed = max(int(max(student_tok.get_vocab().values())) + 1, 2)
        if needed > student_vocab_size:
            raise TokenizerMismatch(f"the student's tokenizer has ids up to {needed - 1} but its model only "
                                    f"{student_vocab_size} rows")
        seq = probe_ids(needed)
        checked: set[int] = set()
        for route, client in clients.items():
            if id(client) in checked:
                continue
            checked.add(id(client))
            try:
                row = client.connect(seq)
            except TeacherRefused as e:
                if e.status in (400, 422):  # the probe holds only the student's ids: a smaller vocabulary refuses it
                    raise TokenizerMismatch(f"teacher {route!r} at {client.url} refused the student's token ids "
                                            f"(up to {needed - 1}): {e.detail} (a smaller vocabulary than the "
                                            "student's tokenizer, or a server that scores no token-id prompt)") from e
                raise
            limit = client.info.get("max_model_len")
            if context is not None and isinstance(limit, int) and limit < context:
                raise ValueError(f"teacher {route!r} at {client.url} serves {limit} tokens per sequence, fewer than "
                                 f"data.max_prompt_len + rollout.max_response_len = {context}")
            if check_tokenizer:
                n = check_spellings(route, client.url, student_tok, seq, row)
                if n == 0:
                    log.warning("teacher %r at %s: the server spells no token, so only token ids and the vocabulary "
                                "size were checked against the student's tokenizer", route, client.url)
        return cls(clients)

    def close(self) -> None:
        for client in {id(c): c for c in self.models.values()}.values():
            client.close()

    def _rows(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str],
              k: int) -> list[ScoredRow]:
        """Every row's scores: the rows of all servers are in flight at once; all or an error."""
        check_row_routes(routes, input_ids.shape[0])
        seqs = unpadded(input_ids.cpu(), attention_mask.cpu())
        keys = list(self.models)
        owners: dict[int, list[int]] = {}
        for b, r in enumerate(routes):
            owners.setdefault(id(self.models[route_of(keys, r)]), []).append(b)
        clients = {id(c): c for c in self.models.values()}
        sent = [(rows, clients[cid].submit([seqs[b] for b in rows if len(seqs[b]) > 1], k))
                for cid, rows in owners.items()]
        out = [ScoredRow([], [], [], []) for _ in seqs]  # a one-token row has nothing to score
        for rows, futures in sent:
            scored = iter(collect(futures))
            for b in rows:
                if len(seqs[b]) > 1:
                    out[b] = next(scored)
        return out

    @torch.no_grad()
    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str]) -> torch.Tensor:
        """As ``Teachers.score``: (B, L) right-padded rows -> (B, L) float32, 0 at position 0 and padding."""
        return self._scored(input_ids, attention_mask, routes, 0).realized

    @torch.no_grad()
    def topk(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str],
             k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Realized logprobs (B, L) and the top-``k`` ids (B, L, k) and logprobs (B, L, k), aligned with
        ``input_ids``; slots the server did not fill (position 0, padding, fewer than k) hold id 0 and ``-inf``."""
        scored = self._scored(input_ids, attention_mask, routes, k)
        assert scored.topk_ids is not None and scored.topk_logprobs is not None
        return scored.realized, scored.topk_ids, scored.topk_logprobs

    def _scored(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str],
                k: int) -> ScoredTokens:
        rows = self._rows(input_ids, attention_mask, routes, k)
        return listed_scores([ListedRow(1, r.realized, r.topk_ids, r.topk_logprobs) for r in rows],
                             input_ids.shape[1], k)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str]) -> torch.Tensor:
        raise ValueError("model.teacher_backend: 'server' gives realized-token logprobs and top-k, no full logits; "
                         "use a loss that needs no more (reverse_kl_pg, k2, k3, forward_kl_topk)")
