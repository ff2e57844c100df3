"""Serve a teacher model over OpenAI-compatible completions (``adwin teacher serve``).

Loads one transformers checkpoint (``--model PATH``, or ``builtin`` for the built-in task's teacher) and answers
``POST /v1/completions`` with token-id prompts scored by it (vLLM's ``prompt_logprobs`` and the legacy
``echo`` + ``logprobs`` form), ``GET /v1/models`` and ``/healthz``; a run points ``model.teachers`` at the URL
with ``model.teacher_backend: server``. Concurrent requests are batched dynamically (``--max-batch-rows``,
``--max-batch-tokens``, ``--max-wait-ms``). Binds 127.0.0.1 by default; any other address needs a bearer token
(``--token`` or ``ADWIN_TEACHER_TOKEN``), which every ``/v1`` route then requires. Prints the URL and the model
once it listens.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from typing import Any

from adwin.controller.serve import resolve_token

log = logging.getLogger(__name__)

TOKEN_ENV = "ADWIN_TEACHER_TOKEN"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="teacher checkpoint folder, or 'builtin' (the built-in "
                        "task's prepared teacher of --route)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the checkpoint's)")
    parser.add_argument("--served-model-name", default=None, help="name clients send as 'model' (default: --model)")
    parser.add_argument("--route", default=None, help="builtin: which route's teacher (default: the first)")
    parser.add_argument("--task", default=None, help="builtin: which built-in task (default: the default task)")
    parser.add_argument("--profile", default="default", help="builtin: the prepared profile (tests use 'tiny')")
    parser.add_argument("--builtin-source", choices=["shipped", "prepared"], default="shipped",
                        help="builtin: the models that ship with adwin, or this machine's own build (as a run's "
                             "model.builtin_source)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8480, help="port (default 8480; 0 picks a free one)")
    parser.add_argument("--token", default=None, help=f"bearer token every /v1 route requires (default: ${TOKEN_ENV})")
    parser.add_argument("--device", default="cpu", help="torch device (cpu, cuda, cuda:1, ...)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights' dtype")
    parser.add_argument("--vocab-size", type=int, default=None, help="output columns served, the students' vocabulary "
                        "size (default: all of the model's); a teacher padded wider then answers as the unpadded one")
    parser.add_argument("--max-len", type=int, default=None,
                        help="tokens per sequence, prompt + max_tokens (default: the model's positions)")
    parser.add_argument("--max-logprobs", type=int, default=20, help="most logprobs / prompt_logprobs a request may "
                        "ask (-1: the whole vocabulary, as vLLM's --max-logprobs -1)")
    parser.add_argument("--max-batch-rows", type=int, default=64, help="sequences per forward")
    parser.add_argument("--max-batch-tokens", type=int, default=16384, help="padded tokens per forward")
    parser.add_argument("--max-wait-ms", type=float, default=5.0,
                        help="how long a forward waits for more requests to batch with")
    parser.add_argument("--max-queue-rows", type=int, default=4096, help="waiting sequences beyond which requests get 503")
    parser.add_argument("--max-body-bytes", type=int, default=None, help="request body limit (default 64 MiB)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"],
                        help="uvicorn log level")


def _checkpoint(args: argparse.Namespace) -> tuple[str, str]:
    """(model folder, tokenizer folder) of ``--model``."""
    if args.model != "builtin":
        return args.model, args.tokenizer or args.model
    from adwin.tasks.shipped import builtin_assets
    from adwin.tasks.suite import DEFAULT_TASK

    assets = builtin_assets(args.profile, 0, args.task or DEFAULT_TASK, args.builtin_source)
    route = args.route or next(iter(assets.teacher_paths))
    if route not in assets.teacher_paths:
        raise ValueError(f"--route {route!r}: the built-in task's routes are {sorted(assets.teacher_paths)}")
    return str(assets.teacher_paths[route]), args.tokenizer or str(assets.tokenizer_path)


def build_service(args: argparse.Namespace) -> Any:
    """Load the model and its tokenizer; the ``TeacherService`` the app serves."""
    import torch

    from adwin.teacher.checkpoints import load_model, load_tokenizer
    from adwin.teacher_server.service import TeacherService

    if args.threads:
        torch.set_num_threads(args.threads)
    for flag in ("vocab_size", "max_logprobs", "max_batch_rows", "max_batch_tokens", "max_queue_rows", "max_body_bytes"):
        value = getattr(args, flag)
        if value is not None and value < 1 and not (flag == "max_logprobs" and value == -1):
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1{' or -1' if flag == 'max_logprobs' else ''}, "
                             f"got {value}")
    path, tok_path = _checkpoint(args)
    return TeacherService.of(load_model(path, args.dtype, args.device), load_tokenizer(tok_path),
                             args.served_model_name or args.model, path=path, max_len=args.max_len,
                             max_logprobs=args.max_logprobs, vocab=args.vocab_size, max_rows=args.max_batch_rows,
                             max_tokens=args.max_batch_tokens, max_wait_s=args.max_wait_ms / 1000.0,
                             max_queue_rows=args.max_queue_rows)


def main(args: argparse.Namespace) -> int:
    import uvicorn

    from adwin.teacher_server.app import DEFAULT_MAX_BODY_BYTES, create_app

    token = resolve_token(args.host, args.token, TOKEN_ENV)
    service = build_service(args)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    host = f"[{args.host}]" if ":" in args.host else args.host
    sys.stdout.write(f"adwin teacher serve: http://{host}:{port}/v1 model {service.name!r} ({service.path}, vocab "
                     f"{service.vocab_size}, max_len {service.max_len}){' token required' if token else ''}\n")
    sys.stdout.flush()
    server = uvicorn.Server(uvicorn.Config(create_app(service, token=token, max_body_bytes=args.max_body_bytes or DEFAULT_MAX_BODY_BYTES), log_level=args.log_level,
                                           access_log=False))
    try:
        server.run(sockets=[sock])
    finally:
        service.batcher.close()
    return 0
