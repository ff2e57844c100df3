"""A stand-in for the student's ``vllm serve`` as TRL's async distillation reaches it, on 127.0.0.1, with no GPU.

It answers the routes TRL's ``VLLMClient`` and its rollout loop call: ``GET /health``, ``GET /v1/models`` (with
``max_model_len``, which TRL reads for ``token_budget=None``), ``POST /v1/completions`` with token-id prompts
(``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``return_token_ids``: the answer's ``choices[0].token_ids``),
and ``POST /pause`` / ``POST /resume`` (keep mode: requests wait while paused). Generation is a tiny transformers
model decoded by adwin's engine. TRL's NCCL weight transfer cannot run here: ``StandInWeights`` is a
``WeightTransferProtocol`` that pauses and resumes the server through TRL's own ``VLLMClient`` and copies the streamed
tensors into the served model in between, where NCCL would.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

from adwin.decode.engine import HFEngine


class StandInServer:
    """The served student; ``requests`` records every completion request's body, ``pauses`` the pause calls."""

    def __init__(self, model: torch.nn.Module, eos_ids: list[int], pad_id: int, *, name: str = "student",
                 max_model_len: int = 64) -> None:
        self.model, self.name, self.max_model_len = model.eval(), name, max_model_len
        self.engine = HFEngine(self.model, set(eos_ids), pad_id, compile=False)
        self.requests: list[dict[str, Any]] = []
        self.pauses = 0
        self.running = threading.Event()
        self.running.set()
        self.lock = threading.Lock()  # one generation or one weight load at a time

    def app(self) -> Any:
        from fastapi import FastAPI

        app = FastAPI()
        app.get("/health")(lambda: {})
        app.get("/v1/models")(lambda: {"object": "list", "data": [{"id": self.name, "object": "model",
                                                                     "max_model_len": self.max_model_len}]})

        @app.post("/v1/completions")
        def complete(body: dict[str, Any]) -> dict[str, Any]:
            self.running.wait(timeout=60)
            self.requests.append(body)
            with self.lock, torch.no_grad():
                gen = self.engine.generate([list(body["prompt"])], [int(body["max_tokens"])],
                                           temperature=float(body.get("temperature", 1.0)),
                                           top_p=float(body.get("top_p", 1.0)), with_logprobs=False,
                                           row_seeds=[int(body.get("seed", 0))])
            ids = gen.response_ids[0]
            return {"id": "cmpl-0", "object": "text_completion", "model": body["model"],
                    "choices": [{"index": 0, "text": "", "token_ids": ids,
                                 "finish_reason": "stop" if gen.finished[0] else "length"}]}

        @app.post("/pause")
        def pause() -> dict[str, str]:
            self.pauses += 1
            self.running.clear()
            return {}

        @app.post("/resume")
        def resume() -> dict[str, str]:
            self.running.set()
            return {}

        return app

    def load(self, named: Iterator[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        with self.lock, torch.no_grad():
            for name, tensor in named:
                params[name].copy_(tensor)


class StandInWeights:
    """TRL's ``WeightTransferProtocol`` into the stand-in: TRL's ``VLLMClient`` pauses and resumes it over HTTP."""

    def __init__(self, server: StandInServer, url: str) -> None:
        from trl.experimental.async_distillation.vllm_client import VLLMClient

        self.server, self.client = server, VLLMClient(url)
        self.sends = 0

    def init_weight_transfer(self) -> None:
        return None

    def pause(self) -> None:
        self.client.pause()

    def send_weights(self, iterator: Iterator[tuple[str, torch.Tensor]]) -> None:
        self.server.load(iterator)
        self.sends += 1

    def resume(self) -> None:
        self.client.resume()

    def destroy(self) -> None:
        return None


@contextlib.contextmanager
def serving(server: StandInServer) -> Iterator[str]:
    """The stand-in on 127.0.0.1 (a free port) for the ``with`` block; yields its root URL (TRL's form)."""
    from adwin.controller.app import serve_app_in_thread

    url, stop = serve_app_in_thread(server.app(), name="vllm-standin")
    try:
        yield url
    finally:
        server.running.set()
        stop()
