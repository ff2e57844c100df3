"""A stand-in teacher server for the client tests: deterministic distributions answered in vLLM's
``prompt_logprobs`` form or the legacy ``echo`` form, over an ``httpx.MockTransport``."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable

import httpx


def key(prefix: list[int]) -> int:
    """The distribution's seed: the context's content, so a sequence scores the same in any request."""
    return sum((t + 1) * 31 ** p for p, t in enumerate(prefix)) % 1_000_003


def dist(n_vocab: int, seed: int) -> list[float]:
    """A normalised log-distribution over ``n_vocab`` tokens, all logprobs distinct."""
    raw = [((seed * 7919 + i * 104729) % 1000) / 100.0 + i * 1e-4 for i in range(n_vocab)]
    z = math.log(sum(math.exp(x) for x in raw))
    return [x - z for x in raw]


def vllm_answer(seqs: list[list[int]], n_vocab: int, k: int) -> dict:
    """What vLLM answers to prompt_logprobs=k: top-k plus the realized token, keyed by id strings."""
    choices = []
    for i, seq in enumerate(seqs):
        entries: list[dict | None] = [None]
        for j in range(1, len(seq)):
            d = dist(n_vocab, key(seq[:j]))
            order = sorted(range(n_vocab), key=lambda t: -d[t])
            entry = {str(t): {"logprob": d[t], "rank": r, "decoded_token": chr(97 + t)}
                     for r, t in enumerate(order[:k], 1)}
            entry.setdefault(str(seq[j]), {"logprob": d[seq[j]], "rank": order.index(seq[j]) + 1,
                                           "decoded_token": chr(97 + seq[j])})
            entries.append(dict(reversed(list(entry.items()))))  # vLLM's order is not the rank order
        choices.append({"index": i, "text": "", "prompt_logprobs": entries})
    return {"choices": list(reversed(choices))}  # choices may come in any order: index decides


def echo_answer(seqs: list[list[int]], n_vocab: int, k: int, ids: bool = True) -> dict:
    choices = []
    for i, seq in enumerate(seqs):
        values: list[float | None] = [None]
        tops: list[dict | None] = [None]
        for j in range(1, len(seq)):
            d = dist(n_vocab, key(seq[:j]))
            values.append(d[seq[j]])
            order = sorted(range(n_vocab), key=lambda t: -d[t])
            tops.append({(f"token_id:{t}" if ids else chr(97 + t)): d[t] for t in order[:k]})
        tokens = [f"token_id:{t}" if ids else chr(97 + t) for t in seq]
        choices.append({"index": i, "text": "", "logprobs": {"tokens": tokens, "token_logprobs": values,
                                                             "top_logprobs": tops}})
    return {"choices": choices}


class FakeTeacher:
    """``/v1/models`` and ``/v1/completions`` of a server with ``n_vocab`` tokens. ``fail``: called with the request
    number and the body before answering; it may return an ``httpx.Response`` (an error) or raise an
    ``httpx.TransportError``. ``forms``: the request forms it answers (others get 400)."""

    def __init__(self, n_vocab: int = 16, *, models: tuple[str, ...] = ("teacher",),
                 forms: tuple[str, ...] = ("prompt_logprobs", "echo"), delay_s: float = 0.0,
                 fail: Callable[[int, dict], httpx.Response | None] | None = None) -> None:
        self.n_vocab, self.models, self.forms, self.delay_s, self.fail = n_vocab, models, forms, delay_s, fail
        self.bodies: list[dict] = []
        self.headers: list[httpx.Headers] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.headers.append(request.headers)
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": m, "max_model_len": 64} for m in self.models]})
        body = json.loads(request.content)
        with self._lock:
            self.bodies.append(body)
            n = len(self.bodies)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(self.delay_s)
            if self.fail is not None and (r := self.fail(n, body)) is not None:
                return r
            seqs = body["prompt"]
            if "prompt_logprobs" in body and "prompt_logprobs" in self.forms:
                return httpx.Response(200, json=vllm_answer(seqs, self.n_vocab, body["prompt_logprobs"]))
            if body.get("echo") and "echo" in self.forms:
                return httpx.Response(200, json=echo_answer(seqs, self.n_vocab, body["logprobs"]))
            return httpx.Response(400, json={"error": {"message": "unknown field"}})
        finally:
            with self._lock:
                self.in_flight -= 1
