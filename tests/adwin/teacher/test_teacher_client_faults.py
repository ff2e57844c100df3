"""``TeacherClient`` against misbehaving servers: HTML, truncated JSON, an error under HTTP 200, a slow or trickling
server past the timeout, the wrong number of choices or rows in another order, 429/503 with ``Retry-After``, and
hostile values. Each is a typed error naming the URL and the field, after bounded retries; nothing partial."""

from __future__ import annotations

import email.utils
import json
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from fake_teacher import FakeTeacher, dist, key, vllm_answer

from adwin.teacher import client as teacher_client
from adwin.teacher.client import (
    ClientSettings,
    TeacherClient,
    TeacherUnavailable,
    retry_after,
)
from adwin.teacher.protocol import TeacherAnswerError

URL = "http://127.0.0.1:9/v1"
SEQS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 1]]


def _client(fake: FakeTeacher, **settings: object) -> TeacherClient:
    c = TeacherClient(URL, ClientSettings(**({"backoff_s": 0.0} | settings)), transport=fake.transport())  # type: ignore[arg-type]
    c.connect([1, 2])
    return c


def _expected(seq: list[int]) -> list[float]:
    return [dist(16, key(seq[:j]))[seq[j]] for j in range(1, len(seq))]


def _after_connect(answer: Callable[[dict], httpx.Response]) -> Callable[[int, dict], httpx.Response | None]:
    """A ``FakeTeacher.fail`` hook: the connect probe is answered well, every later request by ``answer``."""
    return lambda n, body: answer(body) if n > 1 else None


@pytest.mark.parametrize("response,field,text", [
    (httpx.Response(200, html="<html><body>502 Bad Gateway</body></html>"), "body", "not JSON"),
    (httpx.Response(200, content=b'{"choices": [{"index": 0, "prompt_logprobs": [null, {"2": {"logp'), "body",
     "not JSON"),
    (httpx.Response(200, content=b'{"choices": ' + b"[" * 3000 + b"]" * 3000 + b"}"), "body", "not JSON"),
    (httpx.Response(200, content=b"\xff\xfe{}"), "body", "not JSON"),
    (httpx.Response(200, json={"error": {"message": "CUDA out of memory", "type": "InternalServerError"}}), "error",
     "CUDA out of memory"),
    (httpx.Response(200, json={"object": "error", "message": "prompt too long", "code": 400}), "error",
     "prompt too long"),
    (httpx.Response(200, json={"id": "x", "choices": []}), "choices", "0 choices for 2 prompts"),
])
def test_an_answer_that_cannot_be_read_is_a_typed_error_and_not_retried(response: httpx.Response, field: str,
                                                                        text: str) -> None:
    fake = FakeTeacher(fail=_after_connect(lambda body: response))
    client = _client(fake, retries=3)
    with pytest.raises(TeacherAnswerError) as err:
        client.score(SEQS[:2])
    assert err.value.field == field and err.value.url == URL and text in str(err.value)
    assert client.retried == 0


@pytest.mark.parametrize("mutate,field", [
    (lambda a: a["choices"].pop(), "choices"),  # one choice short
    (lambda a: a["choices"].append(dict(a["choices"][0], index=2)), "choices[2].index"),  # one too many
    (lambda a: a["choices"].append(a["choices"][0]), "choices[2].index"),  # a duplicate
    (lambda a: a["choices"][0].update(index="1"), "choices[0].index"),
    (lambda a: a["choices"][0].update(index=True), "choices[0].index"),
    (lambda a: a["choices"][0].update(index=-1), "choices[0].index"),
])
def test_a_different_number_of_choices_or_a_bad_index_is_refused_naming_it(mutate: Callable[[dict], object],
                                                                          field: str) -> None:
    def answer(body: dict) -> httpx.Response:
        a = vllm_answer(body["prompt"], 16, body["prompt_logprobs"])
        mutate(a)
        return httpx.Response(200, json=a)

    with pytest.raises(TeacherAnswerError) as err:
        _client(FakeTeacher(fail=_after_connect(answer))).score(SEQS[:2])
    assert err.value.field == field


def test_rows_in_another_order_are_put_back_by_index() -> None:
    rng = random.Random(0)

    def answer(body: dict) -> httpx.Response:
        a = vllm_answer(body["prompt"], 16, body["prompt_logprobs"])
        rng.shuffle(a["choices"])
        return httpx.Response(200, json=a)

    rows = _client(FakeTeacher(fail=_after_connect(answer)), rows_per_request=4).score(SEQS)
    assert [r.realized for r in rows] == [_expected(s) for s in SEQS]


@pytest.mark.parametrize("value", [10**400, -(10**400), "-0.5", None, [-0.5]],
                         ids=["huge-int", "huge-negative-int", "string", "null", "list"])
def test_a_logprob_that_is_not_a_finite_number_is_refused(value: object) -> None:
    def answer(body: dict) -> httpx.Response:
        a = vllm_answer(body["prompt"], 16, body["prompt_logprobs"])
        choice = next(c for c in a["choices"] if c["index"] == 0)
        choice["prompt_logprobs"][1]["2"]["logprob"] = value
        return httpx.Response(200, content=json.dumps(a).encode())

    with pytest.raises(TeacherAnswerError) as err:
        _client(FakeTeacher(fail=_after_connect(answer))).score([[1, 2, 3]])
    assert err.value.field == "choices[0].prompt_logprobs[1].2.logprob"


@pytest.mark.parametrize("bad_key", ["\u00b2", "\u0663", "-3", "3.0", " 3", "token_id:\u00b9", "x" * 10_000])
def test_a_top_k_key_that_is_not_an_ascii_token_id_is_refused(bad_key: str) -> None:
    def answer(body: dict) -> httpx.Response:
        a = vllm_answer(body["prompt"], 16, body["prompt_logprobs"])
        entry = a["choices"][0]["prompt_logprobs"][1]
        entry[bad_key] = {"logprob": -0.1, "rank": 1}
        return httpx.Response(200, json=a)

    with pytest.raises(TeacherAnswerError, match="is not a token id") as err:
        _client(FakeTeacher(fail=_after_connect(answer))).score([[1, 2, 3]], k=2)
    assert err.value.field == "choices[0].prompt_logprobs[1]" and len(str(err.value)) < 500


def test_a_top_k_id_beyond_the_students_vocabulary_is_refused() -> None:
    fake = FakeTeacher(n_vocab=16)
    client = TeacherClient(URL, ClientSettings(backoff_s=0.0), vocab_size=12, transport=fake.transport())
    client.connect([1, 2])
    with pytest.raises(TeacherAnswerError, match="not below the student's vocabulary size 12") as err:
        client.score([[1, 2, 3, 4, 5]], k=16)
    assert err.value.field.startswith("choices[0].prompt_logprobs[")


def test_an_answer_over_the_size_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _client(FakeTeacher())
    monkeypatch.setattr(teacher_client, "MAX_ANSWER_BYTES", 200)
    with pytest.raises(TeacherAnswerError, match="over 200 bytes") as err:
        client.score(SEQS, k=8)
    assert err.value.field == "body"


def _throttled(times: int, status: int, header: str) -> Callable[[int, dict], httpx.Response | None]:
    return lambda n, body: httpx.Response(status, headers={"retry-after": header},
                                          json={"error": {"message": "slow down"}}) if 1 < n <= 1 + times else None


@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_waited_for_then_the_request_succeeds(status: int) -> None:
    client = _client(FakeTeacher(fail=_throttled(2, status, "0.3")), retries=3)
    t0 = time.perf_counter()
    rows = client.score(SEQS[:1])
    assert time.perf_counter() - t0 >= 0.6 and client.retried == 2  # twice the server's 0.3 s, not 0 s of backoff
    assert rows[0].realized == _expected(SEQS[0])


def test_a_retry_after_longer_than_the_cap_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(teacher_client, "MAX_BACKOFF_S", 0.2)
    client = _client(FakeTeacher(fail=_throttled(1, 503, "86400")), retries=2)
    t0 = time.perf_counter()
    client.score(SEQS[:1])
    assert 0.2 <= time.perf_counter() - t0 < 5


def test_a_server_that_stays_throttled_is_unavailable_after_bounded_retries() -> None:
    client = _client(FakeTeacher(fail=_throttled(99, 429, "0")), retries=2)
    with pytest.raises(TeacherUnavailable) as err:
        client.score(SEQS[:1])
    assert err.value.url == URL and "3 attempts" in str(err.value) and "HTTP 429: slow down" in str(err.value)
    assert client.requests == 2 + 3  # connect: GET /models and the probe; then the three attempts


def test_retry_after_reads_seconds_and_http_dates() -> None:
    soon = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert retry_after({"retry-after": "2"}) == 2.0 and retry_after({"retry-after": "1.5"}) == 1.5
    assert 3.0 < retry_after({"retry-after": soon}) <= 5.0
    for garbage in ("", "soon", "-5", "nan", "inf", "Mon, 99 Foo 2020", "\u0663"):
        assert retry_after({"retry-after": garbage}) == 0.0
    assert retry_after({}) == 0.0


@pytest.fixture
def stalling_server() -> Iterator[Callable[[str], str]]:
    """``start(mode)`` -> the URL of a 127.0.0.1 server that answers every connection with ``mode``: ``silent``
    (reads the request, never answers) or ``trickle`` (200 headers, then one body byte every 0.1 s)."""
    sockets: list[socket.socket] = []
    stop = threading.Event()

    def serve(listener: socket.socket, mode: str) -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            sockets.append(conn)
            threading.Thread(target=handle, args=(conn, mode), daemon=True).start()

    def handle(conn: socket.socket, mode: str) -> None:
        try:
            conn.recv(65536)
            if mode == "trickle":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
                while not stop.is_set():
                    conn.sendall(b" ")
                    time.sleep(0.1)
            else:
                stop.wait(30)
        except OSError:
            return

    def start(mode: str) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        sockets.append(listener)
        threading.Thread(target=serve, args=(listener, mode), daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}/v1"

    yield start
    stop.set()
    for s in sockets:
        s.close()


@pytest.mark.timeout(60)  # without a whole-request deadline the trickle would hold the client for hours
@pytest.mark.parametrize("mode", ["silent", "trickle"])
def test_a_server_slower_than_the_timeout_is_unavailable_in_bounded_time(stalling_server, mode: str) -> None:
    url = stalling_server(mode)
    client = TeacherClient(url, ClientSettings(timeout_s=0.5, retries=1, backoff_s=0.0))
    t0 = time.perf_counter()
    with pytest.raises(TeacherUnavailable) as err:
        client.connect([1, 2])
    elapsed = time.perf_counter() - t0
    assert err.value.url == url and "2 attempts" in str(err.value) and "Timeout" in str(err.value)
    assert 1.0 <= elapsed < 2 * (2 * 0.5) + 2  # each attempt ends by twice the timeout at worst
    client.close()


def test_nothing_partial_is_returned_when_one_request_of_a_call_is_malformed() -> None:
    def answer(body: dict) -> httpx.Response:
        a = vllm_answer(body["prompt"], 16, body["prompt_logprobs"])
        if [6, 7, 8, 9] in body["prompt"]:
            a["choices"][0]["prompt_logprobs"][1] = None
        return httpx.Response(200, json=a)

    client = _client(FakeTeacher(fail=_after_connect(answer)), rows_per_request=1, concurrency=2)
    with pytest.raises(TeacherAnswerError) as err:
        client.score(SEQS)
    assert err.value.field == "choices[0].prompt_logprobs[1]"
