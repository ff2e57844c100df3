"""What the routes of one teacher server share: the served model's name and limits, its token spellings and
the batcher in front of it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from adwin.teacher_server.scoring import Batcher, Scorer

DEFAULT_MAX_LOGPROBS = 20  # vLLM's default cap on logprobs / prompt_logprobs


class BadRequest(ValueError):
    """A request the server cannot score (HTTP 400, or ``status``); ``param`` names the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


def spellings(tokenizer: Any, vocab_size: int) -> tuple[list[str], list[str]]:
    """Per id below ``vocab_size``: the token as the tokenizer stores it (``tokens`` of the echo form) and as it
    decodes alone (``decoded_token``); ids the tokenizer does not know (padding rows of the model) are ''."""
    known = len(tokenizer)
    pieces = tokenizer.convert_ids_to_tokens(list(range(min(known, vocab_size))))
    pieces = [p if isinstance(p, str) else "" for p in pieces] + [""] * max(0, vocab_size - known)
    decoded = [tokenizer.decode([i]) for i in range(min(known, vocab_size))] + [""] * max(0, vocab_size - known)
    return pieces, decoded


@dataclass
class TeacherService:
    name: str  # the model name clients send (GET /v1/models)
    path: str  # the checkpoint it was loaded from
    scorer: Scorer
    batcher: Batcher
    pieces: list[str]
    decoded: list[str]
    max_len: int  # prompt tokens + max_tokens per sequence
    max_logprobs: int = DEFAULT_MAX_LOGPROBS  # -1: the whole vocabulary (vLLM's --max-logprobs -1)
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def of(cls, model: Any, tokenizer: Any, name: str, *, path: str = "", max_len: int | None = None,
           max_logprobs: int = DEFAULT_MAX_LOGPROBS, vocab: int | None = None, **batching: Any) -> TeacherService:
        """Serve ``model`` (a transformers causal LM) with ``tokenizer``'s spellings; ``batching``: ``Batcher``'s
        limits. ``max_len`` defaults to the model's positions; ``vocab``, the output columns served (the students'
        width), to all of the model's (``Scorer``)."""
        positions = getattr(model.config, "max_position_embeddings", None)
        max_len = max_len or positions or 4096
        if positions and max_len > positions:
            raise ValueError(f"--max-len {max_len} is over the model's {positions} positions")
        scorer = Scorer(model, pad_id=int(tokenizer.pad_token_id or 0), vocab=vocab)
        pieces, decoded = spellings(tokenizer, scorer.vocab_size)
        return cls(name, path, scorer, Batcher(scorer.score, **batching), pieces, decoded, max_len, max_logprobs)

    @property
    def vocab_size(self) -> int:
        return self.scorer.vocab_size

    def check(self, model: str | None, seqs: list[list[int]], max_tokens: int) -> None:
        """Refuse what the model cannot score, naming the field."""
        if model is not None and model != self.name:
            raise BadRequest(f"the model {model!r} does not exist; this server serves {self.name!r}", "model", 404)
        if not seqs:
            raise BadRequest("prompt: at least one sequence of token ids", "prompt")
        if len(seqs) > self.batcher.max_queue_rows:  # would wait for a queue it can never fit in: not a 503
            raise BadRequest(f"prompt has {len(seqs)} sequences; this server takes at most "
                             f"{self.batcher.max_queue_rows} per request (--max-queue-rows): split it", "prompt")
        for i, s in enumerate(seqs):
            if not s:
                raise BadRequest(f"prompt[{i}] is empty", f"prompt[{i}]")
            if len(s) + max_tokens > self.max_len:
                raise BadRequest(f"prompt[{i}] has {len(s)} tokens; with max_tokens {max_tokens} that is over this "
                                 f"server's {self.max_len}", f"prompt[{i}]")
            bad = next((j for j, t in enumerate(s) if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise BadRequest(f"prompt[{i}][{bad}] = {s[bad]} is not a token id of this model (0 .. "
                                 f"{self.vocab_size - 1})", f"prompt[{i}][{bad}]")

    def logprob_count(self, field: str, value: int | None) -> int:
        """``logprobs`` / ``prompt_logprobs`` as a number of tokens per position (-1: the whole vocabulary, as
        vLLM reads it; absent: 0), within the vocabulary and ``max_logprobs`` (-1: no cap but the vocabulary)."""
        if value is None:
            return 0
        k = self.vocab_size if value == -1 else value
        if k > self.vocab_size:
            raise BadRequest(f"{field} = {value} is over the model's vocabulary of {self.vocab_size} tokens (-1 asks "
                             "for all of them)", field)
        if self.max_logprobs != -1 and k > self.max_logprobs:
            raise BadRequest(f"{field} = {value}: this server gives at most {self.max_logprobs} logprobs per token "
                             "(--max-logprobs)", field)
        return k
