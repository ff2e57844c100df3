from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import make_tiny_llama
from trainer_fixtures import save_tiny
from transformers import AutoTokenizer

from adwin.objectives.losses import token_logprobs
from adwin.sampling.rollout import layout
from adwin.tasks.tokenizer import build_tokenizer
from adwin.teacher.checkpoints import TokenizerMismatch, check_tokenizers
from adwin.teacher.local import Teachers
from adwin.teacher.routing import UnknownTeacher


def _rows() -> tuple[torch.Tensor, torch.Tensor]:
    rows = layout([[1, 5, 6], [1, 7], [1, 8, 9, 10]], [[11, 12], [13, 2], [14]], pad_id=0)
    return rows.input_ids, rows.attention_mask


def test_each_row_is_scored_by_its_routed_teacher() -> None:
    a, b = make_tiny_llama(seed=4), make_tiny_llama(seed=5)
    teachers = Teachers({"math": a, "code": b})
    ids, attn = _rows()
    got = teachers.score(ids, attn, ["code", "math", "code"])
    with torch.no_grad():
        ref_a = token_logprobs(a(input_ids=ids, attention_mask=attn).logits, ids)
        ref_b = token_logprobs(b(input_ids=ids, attention_mask=attn).logits, ids)
    mask = attn.bool()
    for row, ref in ((0, ref_b), (1, ref_a), (2, ref_b)):
        assert torch.allclose(got[row][mask[row]], ref[row][mask[row]], atol=1e-5)
    assert not torch.allclose(ref_a[0][mask[0]], ref_b[0][mask[0]])  # the routing is observable


def test_unknown_route_names_the_key() -> None:
    teachers = Teachers({"math": make_tiny_llama(seed=4), "code": make_tiny_llama(seed=5)})
    ids, attn = _rows()
    with pytest.raises(UnknownTeacher, match="'poetry'"):
        teachers.score(ids, attn, ["math", "poetry", "code"])


def test_single_teacher_takes_every_route() -> None:
    t = make_tiny_llama(seed=4)
    ids, attn = _rows()
    got = Teachers({"default": t}).score(ids, attn, ["x", "y", "z"])
    with torch.no_grad():
        ref = token_logprobs(t(input_ids=ids, attention_mask=attn).logits, ids)
    assert torch.allclose(got * attn, ref * attn, atol=1e-5)


def test_teachers_are_frozen() -> None:
    t = make_tiny_llama(seed=4)
    Teachers({"default": t})
    assert not any(p.requires_grad for p in t.parameters())


def test_tokenizer_mismatch_is_refused_at_load(tmp_path: Path) -> None:
    save_tiny(tmp_path / "student", seed=0)
    save_tiny(tmp_path / "teacher", seed=1, with_tokenizer=False)
    other = build_tokenizer()
    other.add_tokens(["<extra>"])
    other.save_pretrained(str(tmp_path / "teacher"))
    student_tok = AutoTokenizer.from_pretrained(tmp_path / "student")
    with pytest.raises(TokenizerMismatch, match="teacher 'math' has a different tokenizer"):
        Teachers.load({"math": tmp_path / "teacher"}, student_tok, 64)


def test_vocab_size_mismatch_without_teacher_tokenizer_is_refused(tmp_path: Path) -> None:
    save_tiny(tmp_path / "small", seed=1, vocab_size=48, with_tokenizer=False)
    student_tok = build_tokenizer()
    with pytest.raises(TokenizerMismatch, match="teacher 'default' has vocab size 48"):
        Teachers.load({"default": tmp_path / "small"}, student_tok, 64)


def test_matching_tokenizers_pass() -> None:
    tok = build_tokenizer()
    check_tokenizers(tok, {"a": build_tokenizer(), "b": None}, 64, {"a": 64, "b": 64})


def test_routes_sharing_a_checkpoint_share_one_model(tmp_path: Path) -> None:
    path = save_tiny(tmp_path / "t", seed=1)
    teachers = Teachers.load({"muladd": path, "submul": path}, build_tokenizer(), 64)
    assert teachers.models["muladd"] is teachers.models["submul"]
    ids, attn = _rows()
    got = teachers.score(ids, attn, ["muladd", "submul", "muladd"])
    with torch.no_grad():
        ref = token_logprobs(teachers.models["muladd"](input_ids=ids, attention_mask=attn).logits, ids)
    assert torch.allclose(got * attn, ref * attn, atol=1e-5)


def test_a_teacher_padded_wider_than_the_student_is_read_on_the_students_columns(tmp_path: Path) -> None:
    """Checkpoints of one family pad their output layers differently (Qwen2.5-7B has 152,064 rows, 1.5B 151,936):
    the teacher's extra rows lie past the shared tokenizer, so its dense logits (and the top-k taken from them) and
    its realized-token logprobs are over the student's columns, the support the dense losses compare."""
    teachers = Teachers.load({"default": save_tiny(tmp_path / "wide", seed=1, vocab_size=96)}, build_tokenizer(), 64)
    ids, attn = _rows()
    with torch.no_grad():
        full = teachers.models["default"](input_ids=ids, attention_mask=attn).logits  # (B, L, 96)
    logits = teachers.logits(ids, attn, ["default"] * 3)  # (B, L, 64)
    real = attn.bool()  # padding columns are never read (their positions may be counted either way)
    assert logits.shape == (*ids.shape, 64) and torch.allclose(logits[real], full[..., :64][real], atol=1e-6)
    got = teachers.score(ids, attn, ["default"] * 3)
    assert torch.allclose(got * attn, token_logprobs(full[..., :64], ids) * attn, atol=1e-5)


def test_a_student_wider_than_its_teacher_is_refused_at_load(tmp_path: Path) -> None:
    """A student whose output layer has more rows than the teacher's could sample a padding id the teacher cannot
    read: refused before any compute, naming the teacher and the fix."""
    with pytest.raises(TokenizerMismatch, match="teacher 'default' scores 64 token ids.*96 rows"):
        Teachers.load({"default": save_tiny(tmp_path / "t", seed=1)}, build_tokenizer(), 96)
