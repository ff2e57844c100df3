"""The teachers ``model.teacher_backend`` names: in process, on vLLM, or behind servers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from adwin.teacher.client import ClientSettings
from adwin.teacher.local import Teachers
from adwin.teacher.served import ServedTeachers
from adwin.teacher.vllm import EngineTeachers

AnyTeachers = Teachers | EngineTeachers | ServedTeachers  # what a run scores with (``model.teacher_backend``)


def load_teachers(backend: str, paths: Mapping[str, str | Path], student_tok: object, student_vocab_size: int,
                  dtype: str = "float32", device: str = "cpu", *, gpu_memory: float = 0.3,
                  max_model_len: int | None = None, client: ClientSettings | None = None,
                  check_tokenizer: bool = True) -> AnyTeachers:
    """The teachers ``model.teacher_backend`` names (``hf``: transformers models on ``device``; ``server``:
    ``paths`` are server URLs, talked to with ``client``)."""
    if backend == "server":
        return ServedTeachers.load({k: str(u) for k, u in paths.items()}, student_tok, student_vocab_size,
                                   client or ClientSettings(), context=max_model_len, check_tokenizer=check_tokenizer)
    if backend == "vllm":
        return EngineTeachers.load(paths, student_tok, student_vocab_size, dtype, gpu_memory, max_model_len)
    return Teachers.load(paths, student_tok, student_vocab_size, dtype, device)
