"""``model.teacher_backend: server`` and ``model.teacher_server``: what loads, and what is refused at load naming
the field (a URL without the backend, the backend without URLs, a loss a server cannot feed, ignored knobs)."""

from __future__ import annotations

import pytest

from adwin.config import load_config

URL = "http://127.0.0.1:8000/v1"
SERVED = {"model.teacher_backend": "server", "model.teachers": {"default": URL}}


def test_a_served_teacher_loads_for_the_losses_a_server_feeds() -> None:
    for loss in ("reverse_kl_pg", "forward_kl_topk", "k2", "k3"):
        assert load_config(None, SERVED | {"loss.name": loss}).model.teachers == {"default": URL}
    cfg = load_config(None, SERVED | {"scheduler": "asyncopd", "loss.name": "reverse_kl_pg"})
    assert cfg.model.teacher_backend == "server"  # the AsyncOPD teacher stage scores realized tokens over HTTP
    multi = {"model.teachers": {"math": URL, "code": "http://10.0.0.2:8000/v1#code-teacher"}}
    assert len(load_config(None, SERVED | multi).model.teachers) == 2


@pytest.mark.parametrize("overrides,field", [
    ({"model.teachers": {"default": URL}}, "model.teachers.default"),  # a URL needs the server backend
    ({"model.teacher_backend": "server"}, "model.teachers.default"),  # 'builtin' is not a URL
    (SERVED | {"model.teachers": {"default": URL, "code": "/ckpt/code"}}, "model.teachers.code"),
    (SERVED | {"model.teachers": {"default": "http://"}}, "model.teachers.default"),
    (SERVED | {"loss.name": "forward_kl"}, "loss.name"),  # full logits
    (SERVED | {"loss.name": "jsd"}, "loss.name"),
    (SERVED | {"scheduler": "asyncopd", "loss.name": "reverse_kl_mc"}, "loss.name"),  # cached MC actions
    ({"model.teacher_server.retries": 1}, "model.teacher_server"),  # read only with the server backend
    (SERVED | {"model.teacher_server.concurrency": 0}, "concurrency"),
    (SERVED | {"model.teacher_server.max_tokens": 2}, "max_tokens"),
    (SERVED | {"model.teacher_server.protocol": "grpc"}, "protocol"),
    ({"model.teacher_backend": "vllm", "scheduler": "asyncopd"}, "model.teacher_backend"),
])
def test_a_setting_a_served_teacher_cannot_honour_is_refused_naming_the_field(overrides: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        load_config(None, overrides)


def test_the_client_settings_come_from_the_section_and_the_token_from_the_environment(monkeypatch) -> None:
    cfg = load_config(None, SERVED | {"model.teacher_server.token_env": "MY_TEACHER_TOKEN",
                                      "model.teacher_server.rows_per_request": 3})
    monkeypatch.delenv("MY_TEACHER_TOKEN", raising=False)
    assert cfg.model.teacher_server.client().token is None
    monkeypatch.setenv("MY_TEACHER_TOKEN", "s3cret")
    client = cfg.model.teacher_server.client()
    assert client.token == "s3cret" and client.rows_per_request == 3 and client.retries == 3
