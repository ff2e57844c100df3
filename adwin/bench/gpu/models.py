"""The model pair ``adwin bench gpu`` runs on when the user names none: built in code, nothing downloaded.

The default is SmolLM2-135M's shape (a ~135M-parameter Llama: 30 layers, hidden 576, 9 query / 3 KV heads, a 49,152
vocabulary, tied embeddings) with random weights; ``--quick`` uses a tiny Llama of the same family. The tokenizer
is the built-in task's character tokenizer (``adwin.tasks.tokenizer``): the prompts are the built-in task's, and
the ids past the tokenizer are model rows a tokenizer never produces, as hub checkpoints pad theirs (nothing in
the bench decodes them: evaluation is off).

The teacher is the student with Gaussian noise added to every weight tensor (``TEACHER_NOISE`` times the tensor's
own standard deviation), not a second random init: cost is what the bench measures and both choices cost the
same, but a perturbed copy keeps the two distributions related, as a teacher and its student are, so the OPD
advantages and the audit's gradient cosines are a signal plus noise rather than noise alone.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SMOLLM2_135M: dict[str, Any] = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
                                "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                                "max_position_embeddings": 2048, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
                                "tie_word_embeddings": True}
TINY: dict[str, Any] = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
                        "tie_word_embeddings": False}
TEACHER_NOISE = 0.5
DONE = "adwin-bench-pair.json"  # written last: a folder without it is a cut build, rebuilt


def build_pair(folder: Path, shape: dict[str, Any], dtype: str, seed: int = 0) -> tuple[Path, Path]:
    """``folder/student`` and ``folder/teacher``: checkpoints of ``shape`` saved in ``dtype``, each with the
    tokenizer; reused when a finished build of the same shape, dtype and seed is there."""
    import json

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from adwin.tasks.tokenizer import build_tokenizer
    from adwin.teacher.checkpoints import DTYPES

    student, teacher = folder / "student", folder / "teacher"
    spec = {"shape": shape, "dtype": dtype, "seed": seed, "teacher_noise": TEACHER_NOISE}
    done = folder / DONE
    if done.is_file() and json.loads(done.read_text()) == spec:
        return student, teacher
    tokenizer = build_tokenizer(model_max_length=int(shape["max_position_embeddings"]))
    config = LlamaConfig(**shape, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    log.info("bench gpu: a %.1fM-parameter Llama pair into %s", n_params / 1e6, folder)
    model.to(DTYPES[dtype]).save_pretrained(student)
    tokenizer.save_pretrained(str(student))
    with torch.no_grad():
        for p in model.parameters():
            scale = p.float().std() if p.numel() > 1 else p.new_zeros(())
            if scale > 0:  # norms start at ones: nothing to scale by, left as they are
                p.add_((torch.randn(p.shape, generator=gen) * TEACHER_NOISE * scale).to(p.dtype))
    model.save_pretrained(teacher)
    tokenizer.save_pretrained(str(teacher))
    done.write_text(json.dumps(spec))
    return student, teacher


def parameter_count(config_dir: Path) -> int:
    """Parameters of the checkpoint in ``config_dir``, from its config alone (built on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(config_dir)))
    return sum(p.numel() for p in model.parameters())
