"""The teacher server against hostile clients: every bad input is a 4xx in OpenAI's error shape naming the field
(never a 500), slow, aborted and many concurrent clients do not wedge the batcher, and the server keeps serving."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from tiny_teacher import MAX_LEN, VOCAB, tiny_service

from adwin.controller.app import serve_app_in_thread
from adwin.teacher_server.app import create_app
from adwin.teacher_server.service import TeacherService

SEQ = [1, 14, 20, 5, 33, 9]
GOOD = {"prompt": [SEQ], "prompt_logprobs": 2}


def _raw(url: str, raw: bytes, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", content=raw, headers={"content-type": "application/json"} | headers,
                      timeout=30)


def _assert_error(r: httpx.Response, status: int, param: str | None) -> dict:
    assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status and err["message"]
    assert err["param"] == param, err
    return err


def _still_serves(url: str, service: TeacherService) -> None:
    r = httpx.post(f"{url}/v1/completions", json=GOOD, timeout=30)
    expected = service.scorer.score([SEQ], 0)[0].realized
    got = [r.json()["choices"][0]["prompt_logprobs"][j][str(SEQ[j])]["logprob"] for j in range(1, len(SEQ))]
    assert got == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("raw,param", [
    (b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", "body"),  # past Python's recursion limit
    (b'{"prompt": [1, 2], "model": ' + b"[" * 100 + b"]" * 100 + b"}", "model"),  # past the nesting limit
    (b'{"prompt": [1, 2], "temperature": NaN}', "temperature"),
    (b'{"prompt": [1, 2], "temperature": Infinity}', "temperature"),
    (b'{"prompt": [1, 2], "temperature": 1e400}', "temperature"),
    (b'{"prompt": [[1, 2], [3, NaN]]}', "prompt[1][1]"),
    (b'{"prompt": [' + b"9" * 5000 + b"]}", "body"),  # an integer literal Python refuses to convert
    (b'{"prompt": [1, 2], "model": "\xff\xfe"}', "body"),  # not UTF-8
    (b'{"prompt": [1, 2], "model": "\\ud800"}', "model"),  # a lone surrogate
    (b'{"prompt": [1, 2], "\\udfff": 1}', "body"),
    (b'{"prompt": [1, 2', "body"),  # truncated
    (b"", "body"),
    (b"null", "body"),
    (b"[[1, 2]]", "body"),
])
def test_a_body_that_is_not_strict_json_is_a_400_naming_where(server: str, service: TeacherService, raw: bytes,
                                                              param: str) -> None:
    _assert_error(_raw(server, raw), 400, param)
    _still_serves(server, service)


@pytest.mark.parametrize("field,value", [
    (field, value)
    for field in ("max_tokens", "logprobs", "prompt_logprobs", "n")
    for value in (True, 1.0, 0.5, "1", [1], {"a": 1})
] + [
    ("temperature", True), ("temperature", "1.0"), ("temperature", [1.0]), ("temperature", -0.5),
    ("echo", 1), ("echo", "true"), ("return_tokens_as_token_ids", 0), ("stream", 0), ("stream", "false"),
    ("model", 7), ("model", ["tiny-teacher"]),
])
def test_a_value_of_the_wrong_type_is_a_400_naming_the_field(server: str, field: str, value: object) -> None:
    _assert_error(httpx.post(f"{server}/v1/completions", json={"prompt": [1, 2], field: value}, timeout=30), 400,
                  field)


@pytest.mark.parametrize("prompt,param", [
    ([1, True], "prompt[1]"), ([[1, 2], [3, False]], "prompt[1][1]"), ([1, 2.0], "prompt[1]"),
    ([[1, 2], [3, 1e3]], "prompt[1][1]"), ([-1, 2], "prompt[0][0]"), ([[1, 2], [3, -7]], "prompt[1][2 - 1]"),
    ([[1, 2], [3, VOCAB]], "prompt[1][1]"), ([[1, 2], [3, 2**70]], "prompt[1][1]"), ([], "prompt"),
    ([[]], "prompt[0]"), ([[1, 2], []], "prompt[1]"), ([[1], [[1]]], "prompt[1][0]"), ("héllo wörld", "prompt"),
    ([1] * MAX_LEN, "prompt[0]"), (None, "prompt"),
])
def test_token_ids_outside_the_vocabulary_empty_or_mistyped_are_a_400_naming_the_id(server: str, prompt: object,
                                                                                   param: str) -> None:
    _assert_error(httpx.post(f"{server}/v1/completions", json={"prompt": prompt}, timeout=30), 400,
                  param.replace("2 - 1", "1"))


@pytest.mark.parametrize("field", ["prompt_logprobs", "logprobs"])
@pytest.mark.parametrize("k", [9, VOCAB, VOCAB + 1, 10**6, 2**63, 10**40, -1, -2])
def test_a_logprob_count_over_the_cap_or_the_vocabulary_is_a_400(server: str, field: str, k: int) -> None:
    err = _assert_error(httpx.post(f"{server}/v1/completions", json={"prompt": [1, 2], field: k}, timeout=30), 400,
                        field)
    assert ("vocabulary" if k > VOCAB else "at most 8" if k >= -1 else "greater than") in err["message"]


def test_minus_one_asks_for_the_whole_vocabulary_where_the_cap_allows_it() -> None:
    svc = tiny_service(max_logprobs=-1)
    url, stop = serve_app_in_thread(create_app(svc), name="teacher-test-all")
    try:
        entry = httpx.post(f"{url}/v1/completions", json={"prompt": SEQ, "prompt_logprobs": -1}).json()
        assert len(entry["choices"][0]["prompt_logprobs"][1]) == VOCAB
        _assert_error(httpx.post(f"{url}/v1/completions", json={"prompt": SEQ, "logprobs": VOCAB + 1}), 400,
                      "logprobs")
    finally:
        stop()
        svc.batcher.close()


@pytest.mark.parametrize("name", ["gpt-4", "", "tiny-teacher ", "TINY-TEACHER", "模型", "tïny-teachér", "🦙" * 50,
                                  "x" * 20_000])
def test_an_unknown_model_is_a_404_naming_the_field(server: str, name: str) -> None:
    err = _assert_error(httpx.post(f"{server}/v1/completions", json={"model": name, "prompt": [1, 2]}, timeout=30),
                        404, "model")
    assert "tiny-teacher" in err["message"]


def test_non_ascii_in_every_string_field_is_answered_not_crashed(server: str, service: TeacherService) -> None:
    ok = httpx.post(f"{server}/v1/completions", json=GOOD | {"user": "ünïcødé ✓", "suffix": "日本語", "stop": ["ß"],
                                                             "ключ": "значение"}, timeout=30)
    assert ok.status_code == 200  # fields it does not read are ignored, as vLLM ignores them
    _assert_error(httpx.post(f"{server}/v1/completions", json={"prompt": "日本語"}, timeout=30), 400, "prompt")
    r = httpx.get(f"{server}/v1/mödels")
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    _still_serves(server, service)


@pytest.mark.parametrize("header", [
    "Bearer wrong", "Bearer", "Basic czNjcmV0", "s3cret", "Bearer s3cret-and-more", "Bearer s3cre",
    "Bearer s\u00e9cret", "Token s3cret", "Bearer " + "x" * 8000,
])
def test_a_wrong_authorization_header_is_a_401(locked_server: str, header: str) -> None:
    r = httpx.post(f"{locked_server}/v1/completions", json=GOOD,
                   headers=[(b"authorization", header.encode("latin-1"))], timeout=30)
    _assert_error(r, 401, None)
    assert r.headers["www-authenticate"] == "Bearer"


def test_the_right_token_passes_whatever_the_schemes_case_and_health_needs_none(locked_server: str) -> None:
    for header in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret"):
        r = httpx.post(f"{locked_server}/v1/completions", json=GOOD, headers={"authorization": header}, timeout=30)
        assert r.status_code == 200, header
    for path in ("/health", "/healthz", "/v1/health"):
        assert httpx.get(f"{locked_server}{path}").status_code == 200


def test_a_repeated_v1_in_the_path_is_a_404_that_says_so(server: str) -> None:
    assert httpx.get(f"{server}/v1/health").status_code == 200  # so a client given .../v1 gets this far
    err = _assert_error(httpx.get(f"{server}/v1/v1/models"), 404, None)
    assert "root URL" in err["message"]


def _socket(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=10)


def _request_head(url: str, length: int) -> bytes:
    host = urlsplit(url).netloc
    return (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def test_slow_and_silent_clients_do_not_hold_up_the_others(server: str, service: TeacherService) -> None:
    body = json.dumps(GOOD).encode()
    stalled = []
    for _ in range(8):  # send half a body and stall, or only the headers
        s = _socket(server)
        s.sendall(_request_head(server, len(body)) + body[: len(body) // 2])
        stalled.append(s)
    silent = _socket(server)  # connects and says nothing
    try:
        t0 = time.perf_counter()
        for _ in range(3):
            _still_serves(server, service)
        assert time.perf_counter() - t0 < 20
    finally:
        for s in [*stalled, silent]:
            s.close()
    _still_serves(server, service)


@pytest.fixture
def gated() -> Iterator[tuple[str, TeacherService, threading.Event]]:
    """A server whose forwards wait for the event."""
    svc = tiny_service(max_wait_s=0.0)
    gate, score = threading.Event(), svc.batcher._score
    svc.batcher._score = lambda seqs, k: (gate.wait(30), score(seqs, k))[1]  # type: ignore[method-assign]
    url, stop = serve_app_in_thread(create_app(svc), name="teacher-test-gated")
    yield url, svc, gate
    gate.set()
    stop()
    svc.batcher.close()


def test_a_client_that_hangs_up_while_waiting_does_not_wedge_the_batcher(gated) -> None:
    url, svc, gate = gated
    body = json.dumps({"prompt": [SEQ] * 3, "prompt_logprobs": 1}).encode()
    for _ in range(4):  # the whole request, then gone before the answer
        s = _socket(url)
        s.sendall(_request_head(url, len(body)) + body)
        s.close()
    deadline = time.monotonic() + 10
    while svc.batcher.queued_rows < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    gate.set()
    _still_serves(url, svc)
    deadline = time.monotonic() + 10
    while svc.batcher.queued_rows and time.monotonic() < deadline:
        time.sleep(0.01)
    assert svc.batcher.queued_rows == 0  # every abandoned row left the queue


def test_many_concurrent_clients_with_good_and_bad_requests_each_get_their_own_answer(
        server: str, service: TeacherService) -> None:
    n_clients = 24
    results: dict[int, tuple[int, object]] = {}

    def client(i: int) -> None:
        seq = [1 + i % 7, 14, 20 + i % 5, 5, 33]
        body: dict = {"prompt": [seq, SEQ[: 2 + i % 4]], "prompt_logprobs": 1} if i % 3 else {"prompt": [1, VOCAB + i]}
        with httpx.Client(timeout=60) as c:
            r = c.post(f"{server}/v1/completions", json=body)
        results[i] = (r.status_code, r.json())

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == n_clients
    for i, (status, body) in results.items():
        if i % 3 == 0:
            assert status == 400 and body["error"]["param"] == "prompt[0][1]"  # type: ignore[index]
            continue
        seq = [1 + i % 7, 14, 20 + i % 5, 5, 33]
        expected = service.scorer.score([seq], 0)[0].realized
        choice = body["choices"][0]  # type: ignore[index]
        assert status == 200 and choice["index"] == 0
        got = [choice["prompt_logprobs"][j][str(seq[j])]["logprob"] for j in range(1, len(seq))]
        assert got == pytest.approx(expected, abs=1e-5)
    _still_serves(server, service)


def test_temperature_changes_no_logprob(server: str) -> None:
    """vLLM computes prompt logprobs from the raw logits whatever the request's temperature; so does this server."""
    def answer(temperature: float) -> dict:
        r = httpx.post(f"{server}/v1/completions", json={"prompt": SEQ, "prompt_logprobs": 3, "echo": True,
                                                         "logprobs": 2, "temperature": temperature}, timeout=30)
        choice = r.json()["choices"][0]
        return {"prompt_logprobs": choice["prompt_logprobs"], "logprobs": choice["logprobs"], "text": choice["text"]}

    reference = answer(1.0)
    for t in (0.0, 0.3, 2.0, 100):
        assert answer(t) == reference
