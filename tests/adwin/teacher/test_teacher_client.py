"""``TeacherClient``: batched and concurrent requests, bounded retries with backoff, typed errors naming the URL,
all rows or an error; the served model and the protocol found at start-up."""

from __future__ import annotations

import time

import httpx
import pytest
from fake_teacher import FakeTeacher, dist, key

from adwin.controller.serve import free_port
from adwin.teacher.client import (
    ClientSettings,
    TeacherClient,
    TeacherRefused,
    TeacherUnavailable,
    split_url,
)
from adwin.teacher.protocol import TeacherAnswerError

URL = "http://127.0.0.1:9/v1"
SEQS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 1], [2, 2, 2], [5, 4, 3, 2, 1]]


def _client(fake: FakeTeacher, url: str = URL, **settings: object) -> TeacherClient:
    c = TeacherClient(url, ClientSettings(**({"backoff_s": 0.0} | settings)), transport=fake.transport())  # type: ignore[arg-type]
    c.connect([1, 2])
    return c


def _expected(seq: list[int]) -> list[float]:
    return [dist(16, key(seq[:j]))[seq[j]] for j in range(1, len(seq))]


def test_rows_go_out_in_requests_of_rows_per_request_and_come_back_in_order() -> None:
    fake = FakeTeacher(delay_s=0.05)
    client = _client(fake, rows_per_request=2, concurrency=3)
    rows = client.score(SEQS)
    assert [r.realized for r in rows] == [_expected(s) for s in SEQS]
    sent = fake.bodies[1:]  # the first is connect's probe
    assert [len(b["prompt"]) for b in sent] == [2, 2, 2]
    assert sorted(p for b in sent for p in b["prompt"]) == sorted(SEQS)  # sent concurrently: in any order
    assert 1 < fake.max_in_flight <= 3  # concurrent, within the pool


def test_topk_comes_back_by_rank() -> None:
    rows = _client(FakeTeacher()).score(SEQS[:2], k=4)
    d = dist(16, key([1, 2]))
    assert rows[0].topk_ids[1] == sorted(range(16), key=lambda t: -d[t])[:4]
    assert rows[0].topk_logprobs[1] == sorted(d, reverse=True)[:4]


def test_a_failing_request_is_retried_with_backoff_and_then_answers() -> None:
    fake = FakeTeacher(fail=lambda n, body: httpx.Response(503, json={"error": {"message": "busy"}}) if n in (2, 3) else None)
    client = TeacherClient(URL, ClientSettings(retries=3, backoff_s=0.05), transport=fake.transport())
    client.connect([1, 2])
    t0 = time.perf_counter()
    rows = client.score(SEQS[:2])
    assert time.perf_counter() - t0 >= 0.05 + 0.1  # waited 0.05 s, then 0.1 s (doubling)
    assert [r.realized for r in rows] == [_expected(s) for s in SEQS[:2]] and client.retried == 2


def test_a_server_that_keeps_failing_raises_unavailable_naming_the_url() -> None:
    def reset(n: int, body: dict) -> None:
        if n > 1:
            raise httpx.RemoteProtocolError("server disconnected")

    client = _client(FakeTeacher(fail=reset), retries=2)
    with pytest.raises(TeacherUnavailable) as err:
        client.score(SEQS)
    assert err.value.url == URL and "3 attempts" in str(err.value) and "RemoteProtocolError" in str(err.value)


def test_a_refused_request_is_not_retried_and_nothing_partial_is_returned() -> None:
    fake = FakeTeacher(delay_s=0.05, fail=lambda n, body: httpx.Response(400, json={"error": {"message": "bad ids"}})
                       if 4 in sum(body["prompt"], []) else None)
    client = _client(fake, rows_per_request=1, concurrency=1, retries=5)
    with pytest.raises(TeacherRefused) as err:
        client.score(SEQS)
    assert err.value.status == 400 and "bad ids" in str(err.value) and URL in str(err.value)
    assert client.retried == 0 and len(fake.bodies) <= 1 + 3  # probe, good, refused, one already started: rest cancelled


def test_an_answer_that_is_not_json_is_refused() -> None:
    fake = FakeTeacher(fail=lambda n, body: httpx.Response(200, text="<html>") if n > 1 else None)
    with pytest.raises(TeacherAnswerError) as err:
        _client(fake).score(SEQS[:1])
    assert err.value.field == "body"


def test_an_unreachable_server_fails_after_the_retries() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    client = TeacherClient(url, ClientSettings(retries=1, backoff_s=0.0, timeout_s=2.0))
    with pytest.raises(TeacherUnavailable, match=r"127\.0\.0\.1.*2 attempts.*ConnectError"):
        client.connect([1, 2])


def test_the_token_goes_in_the_authorization_header_and_401_names_the_setting() -> None:
    fake = FakeTeacher(fail=lambda n, body: httpx.Response(401, json={"error": {"message": "no"}}))
    client = TeacherClient(URL, ClientSettings(token="s3cret"), transport=fake.transport())
    with pytest.raises(TeacherRefused, match="token_env"):
        client.connect([1, 2])
    assert fake.headers[0]["authorization"] == "Bearer s3cret"


def test_auto_finds_the_echo_form_when_prompt_logprobs_is_refused() -> None:
    fake = FakeTeacher(forms=("echo",))
    client = _client(fake)
    assert client.protocol == "echo"
    assert [r.realized for r in client.score(SEQS)] == [_expected(s) for s in SEQS]
    assert client.score(SEQS[:1], k=3)[0].topk_ids[0] == sorted(range(16), key=lambda t: -dist(16, key([1]))[t])[:3]


def test_a_server_answering_neither_form_is_refused_at_connect() -> None:
    plain = FakeTeacher(fail=lambda n, body: httpx.Response(200, json={"choices": [{"index": 0, "text": "x"}]}))
    with pytest.raises(TeacherAnswerError, match="neither form"):
        _client(plain)
    with pytest.raises(TeacherRefused, match="unknown field"):  # both refused: the server's own reason
        _client(FakeTeacher(forms=()))


def test_the_model_is_the_only_one_listed_or_the_one_the_url_names() -> None:
    fake = FakeTeacher(models=("base", "math-lora"))
    with pytest.raises(ValueError, match=r"serves \['base', 'math-lora'\].*#base"):
        _client(fake)
    assert _client(fake, URL + "#math-lora").model == "math-lora"
    assert fake.bodies[-1]["model"] == "math-lora"
    with pytest.raises(ValueError, match="does not serve 'code'"):
        _client(fake, URL + "#code")


def test_urls_are_openai_base_urls() -> None:
    assert split_url("http://h:8000") == ("http://h:8000/v1", None)
    assert split_url("https://h/teacher/v1/#m") == ("https://h/teacher/v1", "m")
    with pytest.raises(ValueError, match="not an http"):
        split_url("ftp://h/v1")
