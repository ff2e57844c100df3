"""Teacher scoring on transformers models, with routing of each sample to its teacher.

A teacher scores the realized tokens of prompt+response rows: ``log q(input_ids[b, i])`` from its full
logits at ``i - 1`` (``adwin.objectives.losses.token_logprobs``). OPD compares student and teacher logprobs token by
token, so every teacher must share the student's tokenizer; ``check_tokenizers`` refuses a mismatch at
start-up instead of producing silently wrong losses. ``model.teacher_backend: vllm`` scores with vLLM
prompt logprobs instead (``EngineTeachers``: realized tokens only), ``server`` over HTTP
(``adwin.teacher.served``: realized tokens and top-k).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from adwin.objectives.losses import token_logprobs
from adwin.teacher.client import ClientSettings

if TYPE_CHECKING:
    from adwin.teacher.served import ServedTeachers

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TokenizerMismatch(ValueError):
    """A teacher's tokenizer differs from the student's."""


class UnknownTeacher(ValueError):
    """A sample routes to a teacher key that is not configured."""


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu") -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
    return model.to(device)


def load_tokenizer(path: str | Path) -> object:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token  # generation pads with EOS; masks keep pads out of every loss
    return tok


def _vocab(tokenizer: object) -> dict[str, int]:
    return dict(tokenizer.get_vocab())  # type: ignore[attr-defined]


def check_tokenizers(student_tok: object, teacher_toks: Mapping[str, object | None], student_vocab_size: int,
                     teacher_vocab_sizes: Mapping[str, int]) -> None:
    """Raise ``TokenizerMismatch`` naming the teacher whose vocabulary differs from the student's.

    Tokenizers must map the same strings to the same ids; model vocab sizes may differ only by padding
    rows beyond the tokenizer (common for hub checkpoints), never below the tokenizer's size.
    """
    s_vocab = _vocab(student_tok)
    for key, tok in teacher_toks.items():
        if tok is not None:
            t_vocab = _vocab(tok)
            if t_vocab != s_vocab:
                differ = sum(1 for k, v in s_vocab.items() if t_vocab.get(k) != v) + len(set(t_vocab) - set(s_vocab))
                raise TokenizerMismatch(
                    f"teacher {key!r} has a different tokenizer than the student ({len(t_vocab)} vs "
                    f"{len(s_vocab)} tokens, {differ} entries differ); on-policy distillation needs a shared tokenizer"
                )
        needed = max(s_vocab.values()) + 1
        t_size = teacher_vocab_sizes[key]
        if t_size < needed or (tok is None and t_size != student_vocab_size):
            raise TokenizerMismatch(
                f"teacher {key!r} has vocab size {t_size} but the student's tokenizer needs {needed} "
                f"(student model: {student_vocab_size}); on-policy distillation needs a shared tokenizer"
            )


def route_of(keys: Sequence[str], key: str) -> str:
    """The teacher key that scores route ``key``: the only teacher, or the route's own."""
    if len(keys) == 1:
        return keys[0]
    if key not in keys:
        raise UnknownTeacher(f"no teacher for route {key!r}; model.teachers has {sorted(keys)}")
    return key


def one_per_checkpoint(paths: Mapping[str, str | Path], load: Callable[[str | Path], Any]) -> dict[str, Any]:
    """Route -> ``load(path)``, loading each distinct checkpoint once: routes that share one share the model."""
    by_path: dict[str, Any] = {}
    for p in paths.values():
        if str(p) not in by_path:
            by_path[str(p)] = load(p)
    return {k: by_path[str(p)] for k, p in paths.items()}


def teacher_tokenizers(paths: Mapping[str, str | Path]) -> dict[str, object | None]:
    """Route -> its checkpoint's tokenizer; None for a checkpoint without tokenizer files (the vocab size
    check of ``check_tokenizers`` remains)."""
    toks: dict[str, object | None] = {}
    for k, p in paths.items():
        if Path(p).is_dir() and not (Path(p) / "tokenizer_config.json").exists():
            # every saved HF tokenizer writes this file; without it transformers 4.57 fails inside its converter
            toks[k] = None
            continue
        try:
            toks[k] = load_tokenizer(p)
        except (OSError, ValueError):
            toks[k] = None
    return toks


def rows_per_model(models: Mapping[str, Any], routes: Sequence[str]) -> list[tuple[Any, torch.Tensor]]:
    """``(model, row indices)`` per distinct model of ``routes`` (one route per row): routes that share a
    checkpoint are scored by one call."""
    keys = list(models)
    owner = [id(models[route_of(keys, r)]) for r in routes]
    by_id = {id(m): m for m in models.values()}
    return [(by_id[mid], torch.tensor([b for b, o in enumerate(owner) if o == mid], dtype=torch.long))
            for mid in dict.fromkeys(owner)]


class Teachers:
    """One or more frozen teachers keyed by route; a single teacher scores every route."""

    dense = True  # full logits available (dense losses, the drift diagnostics)

    def __init__(self, models: Mapping[str, torch.nn.Module]) -> None:
        if not models:
            raise ValueError("model.teachers must name at least one teacher")
        self.models = dict(models)
        for m in self.models.values():
            m.eval()
            m.requires_grad_(False)

    @classmethod
    def load(cls, paths: Mapping[str, str | Path], student_tok: object, student_vocab_size: int,
             dtype: str = "float32", device: str = "cpu") -> Teachers:
        """Load every teacher and check its tokenizer against the student's before any compute."""
        models = one_per_checkpoint(paths, lambda p: load_model(p, dtype, device))
        sizes = {k: int(m.config.vocab_size) for k, m in models.items()}
        check_tokenizers(student_tok, teacher_tokenizers(paths), student_vocab_size, sizes)
        return cls(models)

    def route(self, key: str) -> str:
        return route_of(list(self.models), key)

    @torch.no_grad()
    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str]) -> torch.Tensor:
        """Teacher log-probability of each realized token, aligned with ``input_ids``.

        input_ids, attention_mask: (B, L) -> (B, L) float32 (0 at position 0). Rows are grouped by
        teacher so that each teacher runs one forward pass.
        """
        return self._per_teacher(input_ids, attention_mask, routes, lambda lg, ids: token_logprobs(lg, ids).float())

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str]) -> torch.Tensor:
        """Full teacher logits (B, L, V) in the model's raw layout, for the dense losses."""
        return self._per_teacher(input_ids, attention_mask, routes, lambda lg, ids: lg.float())

    def _per_teacher(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str],
                     fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if len(routes) != input_ids.shape[0]:
            raise ValueError(f"{len(routes)} routes for {input_ids.shape[0]} rows")
        out: torch.Tensor | None = None
        for model, rows in rows_per_model(self.models, routes):  # one forward pass per model, not per route
            dev = next(model.parameters()).device
            ids = input_ids[rows].to(dev)
            part = fn(model(input_ids=ids, attention_mask=attention_mask[rows].to(dev)).logits, ids).cpu()
            if out is None:
                out = torch.zeros((input_ids.shape[0], *part.shape[1:]), dtype=part.dtype)
            out[rows] = part
        assert out is not None
        return out


class EngineTeachers:
    """Teachers behind vLLM engines (``model.teacher_backend: vllm``), keyed by route like ``Teachers``:
    realized-token logprobs from prompt logprobs, no full logits (``dense`` is False; the config refuses
    the losses that need them). ``models``: route -> an engine with ``score_rows`` (a ``VLLMTeacher``)."""

    dense = False

    def __init__(self, models: Mapping[str, Any]) -> None:
        if not models:
            raise ValueError("model.teachers must name at least one teacher")
        self.models = dict(models)

    @classmethod
    def load(cls, paths: Mapping[str, str | Path], student_tok: object, student_vocab_size: int,
             dtype: str = "float32", gpu_memory: float = 0.3, max_model_len: int | None = None) -> EngineTeachers:
        """One engine per distinct checkpoint; tokenizers are checked against the student's first (from the
        folders' tokenizer and config files: no weights are loaded before the check)."""
        from transformers import AutoConfig

        from adwin.teacher.vllm import VLLMTeacher

        sizes = {k: int(AutoConfig.from_pretrained(str(p)).vocab_size) for k, p in paths.items()}
        check_tokenizers(student_tok, teacher_tokenizers(paths), student_vocab_size, sizes)
        return cls(one_per_checkpoint(paths, lambda p: VLLMTeacher.load(
            str(p), topk=1, dtype=dtype, gpu_memory_utilization=gpu_memory, max_model_len=max_model_len)))

    def route(self, key: str) -> str:
        return route_of(list(self.models), key)

    @torch.no_grad()
    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str]) -> torch.Tensor:
        """As ``Teachers.score``: (B, L) right-padded rows -> (B, L) float32, one engine call per engine."""
        if len(routes) != input_ids.shape[0]:
            raise ValueError(f"{len(routes)} routes for {input_ids.shape[0]} rows")
        out = torch.zeros(input_ids.shape, dtype=torch.float32)
        for engine, rows in rows_per_model(self.models, routes):
            out[rows] = engine.score_rows(input_ids[rows].cpu(), attention_mask[rows].cpu())
        return out

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, routes: Sequence[str]) -> torch.Tensor:
        raise ValueError("model.teacher_backend: 'vllm' gives realized-token logprobs only, no full logits; set "
                         "model.teacher_backend: hf for the dense losses")


def load_teachers(backend: str, paths: Mapping[str, str | Path], student_tok: object, student_vocab_size: int,
                  dtype: str = "float32", device: str = "cpu", *, gpu_memory: float = 0.3,
                  max_model_len: int | None = None, client: ClientSettings | None = None,
                  check_tokenizer: bool = True) -> Teachers | EngineTeachers | ServedTeachers:
    """The teachers ``model.teacher_backend`` names (``hf``: transformers models on ``device``; ``server``:
    ``paths`` are server URLs, talked to with ``client``)."""
    if backend == "server":
        from adwin.teacher.served import ServedTeachers

        return ServedTeachers.load({k: str(u) for k, u in paths.items()}, student_tok, student_vocab_size,
                                   client or ClientSettings(), context=max_model_len, check_tokenizer=check_tokenizer)
    if backend == "vllm":
        return EngineTeachers.load(paths, student_tok, student_vocab_size, dtype, gpu_memory, max_model_len)
    return Teachers.load(paths, student_tok, student_vocab_size, dtype, device)
