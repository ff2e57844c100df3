"""The one teacher-scoring path: chunked scores equal the whole-batch log-softmax's, the student's columns, and no
teacher forward pass anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from softmax_widths import softmax_widths
from tiny_models import make_tiny_llama, padded_copy

from adwin.objectives.logprobs import action_logprobs, token_logprobs
from adwin.objectives.logprobs import topk_logprobs as full_topk
from adwin.sampling.rollout import layout
from adwin.teacher import scoring
from adwin.teacher.scoring import ScoringInputError, next_topk, score_logits, score_rows, topk_logprobs

ROOT = Path(__file__).resolve().parents[3]


def _rows() -> tuple[torch.Tensor, torch.Tensor]:
    rows = layout([[1, 5, 6], [1, 7], [1, 8, 9, 10]], [[11, 12, 30], [13, 2], [14, 40, 41, 42]], pad_id=0)
    return rows.input_ids, rows.attention_mask  # (3, 8)


@pytest.mark.parametrize("chunk", [1, 3, 7, None])
def test_chunked_scores_equal_the_whole_batch_log_softmax(chunk: int | None) -> None:
    """Realized tokens, top-k and MC actions read a chunk of positions at a time equal what one log-softmax over
    (B, L, V) gives, whatever the chunk (1, one not dividing L - 1, the automatic one)."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn((3, 8, 64), generator=g) * 4  # (B, L, V)
    ids = torch.randint(0, 64, (3, 8), generator=g)  # (B, L)
    actions = torch.randint(-1, 64, (3, 8, 5), generator=g)  # (B, L, m); -1: a padding sentinel
    got = score_logits(logits, ids, k=6, actions=actions, chunk=chunk)
    values, idx = full_topk(logits, 6)  # (B, L, 6)
    assert torch.equal(got.realized, token_logprobs(logits, ids))
    assert torch.equal(got.action_logprobs, action_logprobs(logits, actions))
    assert torch.equal(got.topk_ids[:, 1:], idx[:, 1:]) and torch.equal(got.topk_logprobs[:, 1:], values[:, 1:])
    assert (got.topk_logprobs[:, 0] == -torch.inf).all()  # position 0 has no predictor: unfilled slots


@pytest.mark.parametrize("chunk", [1, 3, None])
def test_a_realized_tokens_rank_counts_the_columns_above_it_ties_in_its_favour(chunk: int | None) -> None:
    """The rank a teacher server lists (vLLM's): 1 + how many columns score strictly higher, whatever the chunk;
    logits rounded to halves make ties common."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn((3, 8, 16), generator=g) * 2).round() / 2  # (B, L, V)
    ids = torch.randint(0, 16, (3, 8), generator=g)  # (B, L)
    got = score_logits(logits, ids, ranks=True, chunk=chunk).ranks  # (B, L)
    logp = torch.log_softmax(logits, dim=-1)  # (B, L, V): position i scores token i + 1
    real = logp[:, :-1].gather(-1, ids[:, 1:, None])  # (B, L-1, 1)
    assert torch.equal(got[:, 1:], 1 + (logp[:, :-1] > real).sum(-1)) and (got[:, 0] == 0).all()
    ties = (logp[:, :-1] == real).sum(-1) > 1  # (B, L-1): the realized token shares its logit with another column
    assert ties.any() and (got[:, 1:][ties] >= 1).all()


def test_the_next_tokens_topk_is_read_after_each_rows_last_real_token() -> None:
    """A right-padded batch: the next token's distribution is at each row's own last column, not the batch's."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn((3, 6, 20), generator=g) * 3  # (B, L, V)
    last = torch.tensor([5, 2, 0])  # (B,)
    values, idx = next_topk(logits, last, 25)
    assert idx.shape == (3, 20)  # k is capped at V
    for b, j in enumerate(last.tolist()):
        ref_values, ref_idx = torch.log_softmax(logits[b, j], dim=-1).topk(20)  # (V,)
        assert torch.equal(idx[b], ref_idx) and torch.allclose(values[b], ref_values, atol=1e-6, rtol=0)
    with pytest.raises(ScoringInputError, match="k"):
        next_topk(logits, last, 0)


def test_topk_from_a_model_or_its_logits_agree_and_k_past_the_vocabulary_leaves_slots_unfilled() -> None:
    teacher = make_tiny_llama(seed=1)
    ids, attn = _rows()
    realized, top_ids, top_lp = topk_logprobs(teacher, ids, attn, k=70, chunk=2)
    with torch.no_grad():
        logits = teacher(input_ids=ids, attention_mask=attn).logits  # (B, L, 64)
    ref_realized, ref_ids, ref_lp = topk_logprobs(logits, ids, k=70)
    real = attn.bool()
    assert torch.allclose(realized[real], ref_realized[real], atol=1e-5)
    assert torch.equal(top_ids[real][:, :64], ref_ids[real][:, :64])
    assert torch.allclose(top_lp[real], ref_lp[real], atol=1e-5)
    assert (top_lp[..., 64:] == -torch.inf).all() and (top_ids[..., 64:] == 0).all()


def test_a_padded_teacher_scores_as_the_unpadded_one_on_the_students_columns() -> None:
    """Qwen2.5-7B pads its output layer past the tokenizer it shares with 1.5B: read on the student's 64 columns,
    a teacher with 32 large padding rows gives the unpadded teacher's realized logprobs and top-k."""
    teacher = make_tiny_llama(seed=1)
    wide = padded_copy(teacher, 96)
    ids, attn = _rows()
    real = attn.bool()
    narrow = topk_logprobs(teacher, ids, attn, k=5)
    padded = topk_logprobs(wide, ids, attn, k=5, vocab=64)
    for a, b in zip(narrow, padded, strict=True):
        assert torch.allclose(a[real].float(), b[real].float(), atol=1e-5)
    unread = score_rows(wide, ids, attn).realized  # the whole padded output as the support
    assert not torch.allclose(unread[real], narrow[0][real], atol=1e-2)


def test_the_log_softmax_never_spans_more_than_one_chunk_of_positions() -> None:
    """Top-k without the B x L x V log-softmax: with ``chunk`` positions the largest normalised block is
    B x chunk x V."""
    teacher = make_tiny_llama(seed=1)
    ids, attn = _rows()
    with softmax_widths() as seen:
        topk_logprobs(teacher, ids, attn, k=4, chunk=2)
    assert seen.sizes and max(seen.sizes) == 3 * 2 * 64


def test_the_automatic_chunk_keeps_within_the_element_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scoring, "CHUNK_ELEMENTS", 3 * 64 * 3)  # three positions of the (3, 8, 64) batch
    teacher = make_tiny_llama(seed=1)
    ids, attn = _rows()
    with softmax_widths() as seen:
        topk_logprobs(teacher, ids, attn, k=4)
    assert max(seen.sizes) == 3 * 3 * 64


@pytest.mark.parametrize(("kwargs", "field"), [({"k": 0}, "k"), ({"k": 2, "chunk": 0}, "chunk"),
                                               ({"k": 2, "temperature": 0.0}, "temperature"),
                                               ({"k": 2, "vocab": 65}, "vocabulary")])
def test_a_call_that_cannot_describe_a_batch_is_refused_naming_what(kwargs: dict, field: str) -> None:
    ids, attn = _rows()
    with pytest.raises(ScoringInputError, match=field):
        topk_logprobs(make_tiny_llama(seed=1), ids, attn, **kwargs)


# --- the one path ---------------------------------------------------------------------------------------------


def _teacher_forwards(path: Path, teacher_module: bool = False) -> list[int]:
    """Lines where ``path`` runs a teacher model itself: a call with ``input_ids=`` or whose ``.logits`` is read, of
    a ``*teacher*`` name, or of any name in a ``teacher_module`` (one that serves a teacher: every model it holds
    is one, ``self.model(...)`` included). Calls into the scoring path itself are its forwards, not the module's."""
    tree = ast.parse(path.read_text())
    reads_logits = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "logits"}
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        if name in vars(scoring) or name.lower().endswith(("scorer", "scores")):
            continue
        if "teacher" not in name.lower() and not teacher_module:
            continue
        if any(k.arg == "input_ids" for k in node.keywords) or id(node) in reads_logits:
            lines.append(node.lineno)
    return lines


# every module is on the path: TRL's async worker reads its teacher through TRL's teacher servers
NOT_YET_ON_THE_PATH: set[str] = set()


def test_no_module_outside_the_teacher_room_runs_a_teacher_forward_pass() -> None:
    """Every scorer reads a teacher through ``adwin.teacher.scoring`` (the student's columns, chunked top-k)."""
    offenders = {}
    for folder in ("adwin", "controller", "probes", "trainer_adapters"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith("adwin/teacher/") or rel in NOT_YET_ON_THE_PATH:
                continue
            if lines := _teacher_forwards(path, teacher_module="teacher" in rel):
                offenders[rel] = lines
    assert offenders == {}


def test_the_forward_pass_finder_sees_a_teacher_called_directly(tmp_path: Path) -> None:
    """The check above is only as good as its finder: the forms the adapters used are found."""
    src = tmp_path / "m.py"
    src.write_text("def f(teacher, ids, am, trainer):\n"
                   "    a = teacher(input_ids=ids, attention_mask=am).logits\n"
                   "    b = trainer.teacher_model(ids).logits\n"
                   "    return teacher_scorer(teacher, vocab=3), a, b\n")
    assert _teacher_forwards(src) == [2, 3]


def test_the_forward_pass_finder_sees_a_served_teachers_own_model_call(tmp_path: Path) -> None:
    """The teacher server held its model as ``self.model`` and ran it beside the path: in a module that serves a
    teacher any model call is found (the server's old form below), and a call into the path is not."""
    src = tmp_path / "m.py"
    src.write_text("class Scorer:\n"
                   "    def score(self, ids, mask):\n"
                   "        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask).logits\n"
                   "        return teacher_logits(self.model, ids, mask, vocab=self.vocab_size), logits\n")
    assert _teacher_forwards(src, teacher_module=True) == [3]
    assert _teacher_forwards(src) == []  # elsewhere a model is the student's until its name says otherwise
