"""The teacher server over HTTP: a test per endpoint and per error status (auth, malformed JSON, ids out of the
vocabulary, too long, wrong types, unknown model and route, limits, overload), its answers read back by adwin's own
client in both forms, and a bounded load test."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
import torch
from tiny_models import make_tiny_llama, padded_copy
from tiny_teacher import MAX_LEN, VOCAB, tiny_service

from adwin.controller.app import serve_app_in_thread
from adwin.tasks.tokenizer import build_tokenizer
from adwin.teacher.client import ClientSettings, TeacherClient
from adwin.teacher.local import Teachers
from adwin.teacher_server.app import create_app
from adwin.teacher_server.service import TeacherService

SEQ = [1, 14, 20, 5, 33, 9]


def _post(url: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30, **kw)  # type: ignore[arg-type]


def test_healthz_answers_without_auth(locked_server: str) -> None:
    r = httpx.get(f"{locked_server}/healthz")
    assert r.status_code == 200 and r.json()["model"] == "tiny-teacher"


def test_models_lists_the_served_model_with_its_limits(server: str) -> None:
    data = httpx.get(f"{server}/v1/models").json()["data"]
    assert [m["id"] for m in data] == ["tiny-teacher"]
    assert data[0]["max_model_len"] == MAX_LEN and data[0]["vocab_size"] == VOCAB


def test_prompt_logprobs_score_every_prompt_token_like_the_local_teacher(server: str, service: TeacherService) -> None:
    r = _post(server, {"model": "tiny-teacher", "prompt": [SEQ, SEQ[:3]], "max_tokens": 1, "prompt_logprobs": 3})
    assert r.status_code == 200
    body = r.json()
    choice = body["choices"][0]
    local = Teachers({"d": service.scorer.model}).score(torch.tensor([SEQ]), torch.ones(1, len(SEQ), dtype=torch.long),
                                                        ["d"])[0]  # (L,)
    entries = choice["prompt_logprobs"]
    assert entries[0] is None and len(entries) == len(SEQ)
    for j in range(1, len(SEQ)):
        realized = entries[j][str(SEQ[j])]
        assert realized["logprob"] == pytest.approx(float(local[j]), abs=1e-5)
        assert realized["decoded_token"] == service.decoded[SEQ[j]]
        ranks = sorted(v["rank"] for v in entries[j].values())
        assert ranks[:3] == [1, 2, 3] and len(entries[j]) in (3, 4)  # top-3, plus the realized token
    assert body["choices"][1]["index"] == 1 and body["usage"]["prompt_tokens"] == len(SEQ) + 3
    assert choice["text"] == service.decoded[service.scorer.score([SEQ], 0)[0].next_id]  # max_tokens 1: the argmax


def test_the_echo_form_covers_the_prompt_and_the_generated_token(server: str, service: TeacherService) -> None:
    r = _post(server, {"prompt": SEQ, "max_tokens": 1, "echo": True, "logprobs": 2, "return_tokens_as_token_ids": True})
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["tokens"][: len(SEQ)] == [f"token_id:{t}" for t in SEQ] and len(lp["tokens"]) == len(SEQ) + 1
    assert lp["token_logprobs"][0] is None and len(lp["top_logprobs"][1]) == 2
    r0 = _post(server, {"prompt": SEQ, "max_tokens": 0, "echo": True, "logprobs": 1})
    lp0 = r0.json()["choices"][0]["logprobs"]
    assert lp0["tokens"] == [service.pieces[t] for t in SEQ] and lp0["token_logprobs"][1:] == lp["token_logprobs"][1 : len(SEQ)]


@pytest.mark.parametrize("protocol", ["prompt_logprobs", "echo"])
def test_adwins_client_reads_both_forms_alike(server: str, service: TeacherService, protocol: str) -> None:
    client = TeacherClient(f"{server}/v1", ClientSettings(protocol=protocol))  # type: ignore[arg-type]
    client.connect([1, 2, 3])
    rows = client.score([SEQ, SEQ[:4]], k=4)
    ref = service.scorer.score([SEQ, SEQ[:4]], 4)
    for row, r in zip(rows, ref, strict=True):
        assert row.realized == pytest.approx(r.realized, abs=1e-6) and row.topk_ids == r.top_ids[: len(row.topk_ids)]
    client.close()


def test_a_token_protects_every_v1_route(locked_server: str) -> None:
    for r in (httpx.get(f"{locked_server}/v1/models"), _post(locked_server, {"prompt": SEQ}),
              _post(locked_server, {"prompt": SEQ}, headers={"Authorization": "Bearer wrong"})):
        assert r.status_code == 401 and r.json()["error"]["type"] == "AuthenticationError"
    ok = _post(locked_server, {"prompt": SEQ, "prompt_logprobs": 1}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200


@pytest.mark.parametrize("body,param", [
    ({"prompt": [1, VOCAB]}, "prompt[0][1]"),  # an id out of the vocabulary
    ({"prompt": [[1, 2], [3, -1]]}, "prompt[1][1]"),
    ({"prompt": [[1, 2], []]}, "prompt[1]"),
    ({"prompt": []}, "prompt"),
    ({"prompt": list(range(MAX_LEN))}, "prompt[0]"),  # too long with max_tokens 1
    ({"prompt": "1 2 3"}, "prompt"),  # text: this server takes token ids
    ({"prompt": [1, "2"]}, "prompt[1]"),
    ({"prompt": [[1, 2], [3, 2.5]]}, "prompt[1][1]"),
    ({"prompt": [1, 2], "max_tokens": 2}, "max_tokens"),  # it scores, it does not generate
    ({"prompt": [1, 2], "max_tokens": "1"}, "max_tokens"),
    ({"prompt": [1, 2], "prompt_logprobs": 9}, "prompt_logprobs"),  # over --max-logprobs
    ({"prompt": [1, 2], "logprobs": -1}, "logprobs"),  # the whole vocabulary: over --max-logprobs too
    ({"prompt": [1, 2], "logprobs": -2}, "logprobs"),
    ({"prompt": [1, 2], "echo": "yes"}, "echo"),
    ({"prompt": [1, 2], "n": 2}, "n"),
    ({"prompt": [1, 2], "stream": True}, "stream"),
    ({"max_tokens": 1}, "prompt"),
])
def test_a_request_it_cannot_score_is_a_400_naming_the_field(server: str, body: dict, param: str) -> None:
    r = _post(server, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == 400 and err["type"] == "BadRequestError"


def test_a_body_that_is_not_json_is_a_400(server: str) -> None:
    r = httpx.post(f"{server}/v1/completions", content=b'{"prompt": [1, 2', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_an_unknown_model_route_or_method_is_a_404_or_405(server: str) -> None:
    r = _post(server, {"model": "gpt-9", "prompt": SEQ})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    assert httpx.get(f"{server}/v1/chat").status_code == 404
    assert httpx.get(f"{server}/v1/completions").status_code == 405


def test_a_body_over_the_limit_is_a_413(server: str) -> None:
    r = _post(server, {"prompt": [[1] * 40] * 2000})
    assert r.status_code == 413 and r.json()["error"]["type"] == "RequestTooLarge"

    def chunks():  # no Content-Length: the streamed bytes are counted
        yield b'{"prompt": ['
        for _ in range(3000):
            yield b"[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],"
        yield b"[1]]}"

    r = httpx.post(f"{server}/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_a_full_queue_answers_503_which_clients_retry_and_a_request_over_it_a_400() -> None:
    svc = tiny_service(max_queue_rows=2)
    gate, score = threading.Event(), svc.batcher._score
    svc.batcher._score = lambda seqs, k: (gate.wait(30), score(seqs, k))[1]  # type: ignore[method-assign]
    url, stop = serve_app_in_thread(create_app(svc), name="teacher-test-queue")
    try:
        held = svc.batcher.submit([[1, 2], [3, 4]], 0)  # the queue is full until the gate opens
        r = _post(url, {"prompt": [[1, 2]]})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        r = _post(url, {"prompt": [[1, 2]] * 3})  # more rows than the queue ever holds: retrying cannot help
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt" and "split" in r.text
        gate.set()
        held.result(timeout=30)
        assert _post(url, {"prompt": [[1, 2]] * 2, "prompt_logprobs": 1}).status_code == 200
    finally:
        gate.set()
        stop()
        svc.batcher.close()


def test_concurrent_clients_are_all_answered_in_bounded_time(server: str, service: TeacherService) -> None:
    clients, per_client = 8, 5
    before = service.batcher.stats.batches
    failures: list[str] = []
    expected = service.scorer.score([SEQ], 0)[0].realized

    def run() -> None:
        with httpx.Client(timeout=30) as c:
            for _ in range(per_client):
                r = c.post(f"{server}/v1/completions", json={"prompt": [SEQ] * 4, "prompt_logprobs": 1})
                rows = r.json()["choices"] if r.status_code == 200 else []
                if len(rows) != 4 or any(ch["prompt_logprobs"][2][str(SEQ[2])]["logprob"] != pytest.approx(
                        expected[1], abs=1e-5) for ch in rows):
                    failures.append(r.text[:200])

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    elapsed = time.perf_counter() - t0
    assert not failures and elapsed < 60
    assert service.batcher.stats.batches - before < clients * per_client  # requests shared forwards


def _same_answer(a: Any, b: Any, where: str = "") -> None:
    """Two JSON answers alike: the same keys, ids, ranks and spellings; numbers to float32 rounding."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a.keys() - {"id", "created"}:
            _same_answer(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same_answer(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, abs=1e-5, rel=0), where
    else:
        assert a == b, where


def test_a_teacher_padded_past_the_students_vocabulary_answers_as_the_unpadded_one() -> None:
    """Qwen2.5-7B's output is wider than 1.5B's: served on the students' 64 columns, a teacher with 32 large padding
    rows lists the vocabulary, scores, ranks, top-k and the next token the unpadded teacher does."""
    model = make_tiny_llama(vocab_size=VOCAB, seed=10)
    kw: dict[str, Any] = {"max_len": MAX_LEN, "max_logprobs": 8}
    services = {"narrow": TeacherService.of(model, build_tokenizer(), "t", **kw),
                "padded": TeacherService.of(padded_copy(model, VOCAB + 32), build_tokenizer(), "t", vocab=VOCAB, **kw),
                "unread": TeacherService.of(padded_copy(model, VOCAB + 32), build_tokenizer(), "t", **kw)}
    bodies = [{"prompt": [SEQ, SEQ[:3]], "max_tokens": 1, "prompt_logprobs": 5},
              {"prompt": SEQ, "max_tokens": 1, "echo": True, "logprobs": 3, "return_tokens_as_token_ids": True}]
    answers: dict[str, list[Any]] = {}
    for name, svc in services.items():
        url, stop = serve_app_in_thread(create_app(svc), name=f"teacher-{name}")
        try:
            answers[name] = [httpx.get(f"{url}/v1/models").json()["data"][0]["vocab_size"]]
            answers[name] += [_post(url, body).json() for body in bodies]
        finally:
            stop()
            svc.batcher.close()
    _same_answer(answers["padded"], answers["narrow"])
    realized = [answers[n][1]["choices"][0]["prompt_logprobs"][2][str(SEQ[2])]["logprob"] for n in ("narrow", "unread")]
    assert answers["unread"][0] == VOCAB + 32 and abs(realized[0] - realized[1]) > 1e-2  # the padding matters
