"""An HTTP client for one teacher server (``model.teacher_backend: server``): batched, concurrent, bounded.

The server is any OpenAI-compatible completions endpoint that scores prompt tokens (``vllm serve``, SGLang,
``adwin teacher serve``); the request and answer forms are ``adwin.teacher.protocol``. A call to
``TeacherClient.score`` splits its sequences into requests of ``rows_per_request`` prompts, sends up to
``concurrency`` at once over one keep-alive connection pool (httpx), and returns every row or raises:

* ``TeacherUnavailable`` (a ``ConnectionError``) when a request still fails after ``retries`` retries with
  exponential backoff, or the wait a 429/503 asks for in ``Retry-After`` when that is longer (at most
  ``MAX_BACKOFF_S``): connection refused or reset, an answer not complete within ``timeout_s`` (the whole
  request, not each read: a server that trickles bytes times out too), HTTP 408/429/5xx;
* ``TeacherRefused`` (a ``ValueError``) at once for any other HTTP error (a bad request, a wrong token);
* ``TeacherAnswerError`` for an answer that cannot be trained on (``adwin.teacher.protocol``): not JSON (an HTML page,
  a truncated body), an error body under HTTP 200, more than ``MAX_ANSWER_BYTES``, or a malformed answer.

Nothing partial is returned: one failed request fails the call, and the requests still queued are cancelled.
The URL is an OpenAI base URL (``http://host:8000/v1``; a bare ``http://host:8000`` means ``/v1``); a fragment
names the served model (``http://host:8000/v1#qwen-math``), otherwise the server must list exactly one.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import httpx

from adwin.teacher.protocol import (
    PROTOCOLS,
    Protocol,
    ScoredRow,
    TeacherAnswerError,
    completion_request,
    parse_completion,
)

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})  # the server may answer later: retried
MAX_BACKOFF_S = 30.0  # the longest wait between attempts, Retry-After included
MAX_ANSWER_BYTES = 1 << 30  # 8 rows of 4096 tokens with top-100 are ~0.3 GB; more is a server gone wrong


class TeacherUnavailable(ConnectionError):
    """A teacher server did not answer after the retries; names the URL and the last failure."""

    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url = url


class TeacherRefused(ValueError):
    """A teacher server refused a request (an HTTP error that no retry changes); names the URL and status."""

    def __init__(self, url: str, status: int, detail: str) -> None:
        super().__init__(f"teacher server {url} answered HTTP {status}: {detail}")
        self.url, self.status, self.detail = url, status, detail


@dataclass(frozen=True)
class ClientSettings:
    """How a client talks to its server (``model.teacher_server`` in a run's config)."""

    protocol: Literal["auto", "prompt_logprobs", "echo"] = "auto"
    timeout_s: float = 60.0
    retries: int = 3
    backoff_s: float = 0.5
    concurrency: int = 4
    rows_per_request: int = 8
    max_tokens: int = 1
    token: str | None = None


def split_url(url: str) -> tuple[str, str | None]:
    """``http://host:port/v1#name`` -> (``http://host:port/v1``, ``name``); a bare host gets ``/v1``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url!r} is not an http(s) URL of a teacher server (e.g. http://127.0.0.1:8000/v1)")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, "")), parts.fragment or None


def error_detail(raw: bytes) -> str:
    """The message of an error answer: OpenAI's ``{"error": {"message"}}``, vLLM's older ``{"message"}``,
    FastAPI's ``{"detail"}``, or the start of the text."""
    text = raw[:100_000].decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        return text[:300]
    if isinstance(body, dict):
        err = body.get("error")
        for value in (err.get("message") if isinstance(err, dict) else err, body.get("message"), body.get("detail")):
            if value:
                return str(value)[:300]
    return str(body)[:300]


def retry_after(headers: Mapping[str, str]) -> float:
    """Seconds a ``Retry-After`` header asks to wait (delay-seconds or an HTTP date); 0 when absent or unreadable."""
    value = headers.get("retry-after", "").strip()
    if not value.isascii():  # float() reads other scripts' digits
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return 0.0
        seconds = when.timestamp() - time.time()
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def _json_answer(url: str, path: str, raw: bytes) -> Any:
    """A 200 answer's JSON, or a ``TeacherAnswerError``: not JSON, or an error body (vLLM's older servers and some
    proxies answer errors with 200)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:  # HTML, a truncated body, invalid UTF-8, nesting past the recursion limit
        shown = raw[:80].decode("utf-8", "replace")
        raise TeacherAnswerError(url, "body", f"the answer to {path} is not JSON ({type(e).__name__}; it starts "
                                 f"{shown!r})") from e
    if isinstance(body, dict) and "choices" not in body and "data" not in body and (
            "error" in body or body.get("object") == "error"):
        raise TeacherAnswerError(url, "error", f"HTTP 200 with an error body: {error_detail(raw)}")
    return body


class TeacherClient:
    """One teacher server. ``transport``: an httpx transport for tests (``httpx.MockTransport``)."""

    def __init__(self, url: str, settings: ClientSettings | None = None, *, vocab_size: int | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.settings = s = settings or ClientSettings()
        self.vocab_size = vocab_size  # top-k ids must be below it (the student's rows); None: not checked
        self.url, self.model = split_url(url)
        self.protocol: Protocol | None = None if s.protocol == "auto" else s.protocol
        self.info: dict[str, Any] = {}  # the server's /models entry for self.model
        headers = {"Authorization": f"Bearer {s.token}"} if s.token else {}
        self._http = httpx.Client(
            timeout=httpx.Timeout(s.timeout_s, connect=min(s.timeout_s, 10.0)), headers=headers,
            limits=httpx.Limits(max_connections=s.concurrency, max_keepalive_connections=s.concurrency),
            transport=transport)
        self._pool = ThreadPoolExecutor(max_workers=s.concurrency, thread_name_prefix="teacher-client")
        self._lock = threading.Lock()
        self.requests = 0  # requests sent, retries included
        self.retried = 0  # requests sent again after a failure

    def __repr__(self) -> str:
        return f"TeacherClient({self.url!r}, model={self.model!r}, protocol={self.protocol!r})"

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()

    # --- HTTP with retries ---------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request, retried on transport errors, timeouts and ``RETRY_STATUS`` with exponential backoff (or
        the server's ``Retry-After``, when longer)."""
        s, url = self.settings, f"{self.url}{path}"
        reason, wait = "", 0.0
        for attempt in range(s.retries + 1):
            if attempt:
                with self._lock:
                    self.retried += 1
                time.sleep(wait)
            with self._lock:
                self.requests += 1
            wait = min(MAX_BACKOFF_S, s.backoff_s * 2 ** attempt)
            try:
                status, headers, raw = self._exchange(method, url, body)
            except httpx.TransportError as e:  # refused, reset, timed out
                reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                continue
            if status == 200:
                return _json_answer(self.url, path, raw)
            if status not in RETRY_STATUS:
                hint = " (set the token's environment variable, model.teacher_server.token_env)" \
                    if status == 401 else ""
                raise TeacherRefused(self.url, status, error_detail(raw) + hint)
            reason = f"HTTP {status}: {error_detail(raw)}"
            wait = min(MAX_BACKOFF_S, max(wait, retry_after(headers)))
        raise TeacherUnavailable(self.url, f"teacher server {self.url} did not answer {method} {path} after "
                                           f"{s.retries + 1} attempts (last: {reason}); check that it runs, "
                                           "or raise model.teacher_server.retries / timeout_seconds")

    def _exchange(self, method: str, url: str, body: dict[str, Any] | None) -> tuple[int, httpx.Headers, bytes]:
        """Status, headers and body of one request, all within ``timeout_s`` from the start (httpx's timeouts
        bound each read, so a server that trickles bytes would never time out) and at most ``MAX_ANSWER_BYTES``."""
        deadline = time.monotonic() + self.settings.timeout_s
        with self._http.stream(method, url, json=body) as r:
            chunks, size = [], 0
            for chunk in r.iter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise TeacherAnswerError(self.url, "body", f"the answer is over {MAX_ANSWER_BYTES} bytes (lower "
                                             "model.teacher_server.rows_per_request)")
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout(f"no complete answer within {self.settings.timeout_s} s",
                                            request=r.request)
            return r.status_code, r.headers, b"".join(chunks)

    # --- start-up -------------------------------------------------------------------------------------

    def connect(self, probe: Sequence[int]) -> ScoredRow:
        """Find the served model (``GET /models``) and the protocol (``auto``: ``prompt_logprobs`` first, then
        ``echo``) and score ``probe`` once; its answer feeds the tokenizer check."""
        listing = self._call("GET", "/models")
        data = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and isinstance(m.get("id"), str) for m in data):
            raise TeacherAnswerError(self.url, "data", "GET /models did not list models ({'data': [{'id': ...}]})")
        names = [m["id"] for m in data]
        if self.model is None:
            if len(names) != 1:
                raise ValueError(f"teacher server {self.url} serves {names}: name one after '#' in its URL "
                                 f"(e.g. {self.url}#{names[0] if names else 'NAME'})")
            self.model = names[0]
        elif self.model not in names:
            raise ValueError(f"teacher server {self.url} does not serve {self.model!r} (it serves {names})")
        self.info = next(m for m in data if m["id"] == self.model)
        if self.protocol is not None:
            return self._score_one(probe, self.protocol)
        failures: list[TeacherRefused | TeacherAnswerError] = []
        for protocol in PROTOCOLS:
            try:
                row = self._score_one(probe, protocol)
            except (TeacherRefused, TeacherAnswerError) as e:
                if isinstance(e, TeacherRefused) and e.status not in (400, 422):  # auth, not the form
                    raise
                failures.append(e)
                continue
            self.protocol = protocol
            log.info("teacher server %s: model %r, protocol %s", self.url, self.model, protocol)
            return row
        if all(isinstance(e, TeacherRefused) for e in failures):  # both forms refused: the probe's ids, most likely
            raise failures[-1]
        raise TeacherAnswerError(self.url, "protocol", "answers neither form of prompt scoring; "
                                 + "; ".join(f"{p}: {e}" for p, e in zip(PROTOCOLS, failures, strict=True)))

    def _score_one(self, seq: Sequence[int], protocol: Protocol) -> ScoredRow:
        body = completion_request(self._model(), [seq], protocol, 0, self.settings.max_tokens)
        return parse_completion(self.url, self._call("POST", "/completions", body), [seq], protocol, 0,
                                vocab_size=self.vocab_size)[0]

    def _model(self) -> str:
        if self.model is None:
            raise RuntimeError(f"teacher client {self.url}: call connect() first")
        return self.model

    # --- scoring --------------------------------------------------------------------------------------

    def submit(self, seqs: Sequence[Sequence[int]], k: int = 0) -> list[Future[list[ScoredRow]]]:
        """Send ``seqs`` (whole sequences of token ids) in requests of ``rows_per_request``; ``collect`` waits."""
        if self.protocol is None:
            raise RuntimeError(f"teacher client {self.url}: call connect() first")
        n = self.settings.rows_per_request
        return [self._pool.submit(self._request, seqs[i : i + n], k) for i in range(0, len(seqs), n)]

    def _request(self, seqs: Sequence[Sequence[int]], k: int) -> list[ScoredRow]:
        assert self.protocol is not None
        body = completion_request(self._model(), seqs, self.protocol, k, self.settings.max_tokens)
        return parse_completion(self.url, self._call("POST", "/completions", body), seqs, self.protocol, k,
                                vocab_size=self.vocab_size)

    def score(self, seqs: Sequence[Sequence[int]], k: int = 0) -> list[ScoredRow]:
        """Every sequence's scores, in order, or an error (nothing partial)."""
        return collect(self.submit(seqs, k))


def collect(futures: Sequence[Future[list[ScoredRow]]]) -> list[ScoredRow]:
    """The rows of every request in order; the first failure cancels the requests not yet sent and is raised."""
    rows: list[ScoredRow] = []
    try:
        for f in futures:
            rows += f.result()
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    return rows
