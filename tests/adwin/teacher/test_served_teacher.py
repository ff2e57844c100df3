"""``ServedTeachers``: the same logprobs as in-process teachers (1e-5), rows routed to their own server, and a
server that does not match the student (tokenizer, vocabulary, context) or answers badly refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch
from fake_teacher import FakeTeacher, vllm_answer
from teacher_servers import in_thread
from tiny_models import make_tiny_llama
from trainer_fixtures import save_tiny

from adwin.controller.app import serve_app_in_thread
from adwin.objectives.losses import topk_logprobs
from adwin.tasks.tokenizer import build_tokenizer
from adwin.teacher.checkpoints import TokenizerMismatch
from adwin.teacher.client import ClientSettings
from adwin.teacher.local import Teachers
from adwin.teacher.protocol import TeacherAnswerError
from adwin.teacher.served import ServedTeachers, probe_ids
from adwin.teacher_server.app import create_app
from adwin.teacher_server.service import TeacherService

URL = "http://127.0.0.1:9/v1"


def _rows(seed: int, B: int = 7, L: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 53, (B, L), generator=g)  # (B, L) ids the student's tokenizer knows
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    attn = (torch.arange(L)[None] < lengths[:, None]).long()  # (B, L) right-padded; some rows of one token
    return ids * attn, attn


def _scored(attn: torch.Tensor) -> torch.Tensor:
    """(B, L) positions that carry a teacher score: in the row, not position 0."""
    m = attn.bool().clone()
    m[:, 0] = False
    return m


@pytest.fixture(scope="module")
def two_teachers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("teachers")
    return {"math": save_tiny(tmp / "math", seed=10), "code": save_tiny(tmp / "code", seed=11)}


def test_two_servers_score_their_own_routes_as_the_local_teachers_do(two_teachers: dict[str, Path]) -> None:
    tok = build_tokenizer()
    local = Teachers.load(two_teachers, tok, 64)
    with in_thread(two_teachers["math"], "math") as u_math, in_thread(two_teachers["code"], "code") as u_code:
        served = ServedTeachers.load({"math": u_math, "code": u_code}, tok, 64, ClientSettings(rows_per_request=2))
        ids, attn = _rows(0)
        routes = ["math", "code", "code", "math", "code", "math", "math"]
        a, b = local.score(ids, attn, routes), served.score(ids, attn, routes)  # (B, L)
        m = _scored(attn)
        assert (a - b)[m].abs().max() <= 1e-5 and not b[~m].any()
        swapped = served.score(ids, attn, ["code" if r == "math" else "math" for r in routes])
        assert (swapped - b)[m].abs().max() > 1e-2  # each route is its own server's answer
        realized, top_ids, top_lp = served.topk(ids, attn, routes, 5)  # (B, L), (B, L, 5) x2
        ref_lp, ref_ids = topk_logprobs(local.logits(ids, attn, routes), 5)  # (B, L, 5)
        assert (realized - a)[m].abs().max() <= 1e-5
        assert torch.equal(top_ids[m], ref_ids[m]) and (top_lp[m] - ref_lp[m]).abs().max() <= 1e-5
        assert torch.isinf(top_lp[~m]).all()  # unscored slots: q = 0 for forward_kl_topk
        served.close()


def _shuffled_tokenizer():
    """The built-in character tokenizer with two characters' ids swapped: same size, different tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    base = build_tokenizer().get_vocab()
    vocab = dict(base)
    vocab["a"], vocab["b"] = base["b"], base["a"]
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                                   unk_token="<unk>")


def _serve(model: torch.nn.Module, tokenizer: object):
    service = TeacherService.of(model, tokenizer, "t")
    url, stop = serve_app_in_thread(create_app(service), name="teacher-mismatch")
    return service, url, stop


def test_a_server_with_another_tokenizer_is_refused_naming_the_token() -> None:
    service, url, stop = _serve(make_tiny_llama(vocab_size=64, seed=10), _shuffled_tokenizer())
    try:
        with pytest.raises(TokenizerMismatch, match=r"teacher 'default' at .*spells token id \d+ '[ab]'"):
            ServedTeachers.load({"default": f"{url}/v1"}, build_tokenizer(), 64, ClientSettings())
        assert ServedTeachers.load({"default": f"{url}/v1"}, build_tokenizer(), 64, ClientSettings(),
                                   check_tokenizer=False).models  # the check can be turned off
    finally:
        stop()
        service.batcher.close()


def test_a_server_with_a_smaller_vocabulary_is_refused() -> None:
    tok = build_tokenizer()
    service, url, stop = _serve(make_tiny_llama(vocab_size=32, seed=10), tok)
    try:
        with pytest.raises(TokenizerMismatch, match=r"refused the student's token ids \(up to 52\)"):
            ServedTeachers.load({"default": f"{url}/v1"}, tok, 64, ClientSettings())
    finally:
        stop()
        service.batcher.close()


def test_a_server_shorter_than_the_run_is_refused_naming_the_fields() -> None:
    fake = FakeTeacher(n_vocab=64)  # lists max_model_len 64
    with pytest.raises(ValueError, match=r"serves 64 tokens.*data\.max_prompt_len \+ rollout\.max_response_len = 65"):
        ServedTeachers.load({"default": URL}, build_tokenizer(), 64, ClientSettings(), context=65,
                            transport=fake.transport())


def _corrupt(field: str):
    def fail(n: int, body: dict) -> httpx.Response | None:
        if n == 1:  # the start-up probe is answered well
            return None
        answer = vllm_answer(body["prompt"], 64, body["prompt_logprobs"])
        entries = answer["choices"][-1]["prompt_logprobs"]  # choices are reversed: the last is prompt 0
        if field == "length":
            entries.pop()
        elif field == "nan":
            entries[1] = {k: {**v, "logprob": float("nan")} for k, v in entries[1].items()}
        elif field == "token":
            entries[1] = {str(int(k) + 1): v for k, v in entries[1].items() if int(k) + 1 < 64}
        return httpx.Response(200, content=json.dumps(answer).encode(),  # NaN as JavaScript spells it
                              headers={"content-type": "application/json"})
    return fail


@pytest.mark.parametrize("fault,field", [("length", "choices[0].prompt_logprobs"),
                                         ("nan", r"choices[0].prompt_logprobs[1]"),
                                         ("token", "choices[0].prompt_logprobs[1]")])
def test_a_malformed_answer_fails_the_whole_call_naming_the_field(fault: str, field: str) -> None:
    fake = FakeTeacher(n_vocab=64, fail=_corrupt(fault))
    served = ServedTeachers.load({"default": URL}, build_tokenizer(), 64, ClientSettings(), transport=fake.transport(),
                                 check_tokenizer=False)  # the fake spells tokens its own way
    ids, attn = _rows(1, B=3)
    attn[:, :3] = 1
    with pytest.raises(TeacherAnswerError) as err:
        served.score(ids, attn, ["default"] * 3)
    assert err.value.field.startswith(field)


def test_the_probe_spans_the_students_vocabulary() -> None:
    ids = probe_ids(53)
    assert ids[0] == 0 and ids[-1] == 52 and len(ids) == len(set(ids)) >= 26
    assert probe_ids(151_000)[-1] == 150_999 and len(probe_ids(151_000)) <= 50
