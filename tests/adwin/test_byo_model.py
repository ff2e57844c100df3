"""The "bring your own model" recipe (configs/byo-model.yaml, docs/byo-model.md) end to end through the CLI:
a real-architecture checkpoint (Qwen2, random weights, built in code) as student and teacher, a tokenizer
with a chat template built locally with the ``tokenizers`` library, JSONL prompts with answers."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

import adwin.loop.parts as parts_module
from adwin.cli import main
from adwin.sampling.rollout import encode_prompts
from adwin.teacher.checkpoints import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
SPECIALS = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
CHARS = list("0123456789+=? \n") + [chr(c) for c in range(ord("a"), ord("z") + 1)]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_chat_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer whose chat template wraps a turn in ``<|im_start|>``/``<|im_end|>``."""
    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", eos_token="<|im_end|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_qwen2(path: Path, tok: PreTrainedTokenizerFast, seed: int) -> Path:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(path)
    tok.save_pretrained(str(path))
    return path


def test_byo_recipe_trains_a_qwen2_checkpoint_with_a_chat_template_from_jsonl(tmp_path: Path, monkeypatch) -> None:
    tok = build_chat_tokenizer()
    student, teacher = save_qwen2(tmp_path / "student", tok, 0), save_qwen2(tmp_path / "teacher", tok, 1)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"{i % 7}+{i % 3}=?", "answer": str(i % 7 + i % 3)}) + "\n"
                             for i in range(20)))
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps({"prompt": f"{i}+1=?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    checked: list[tuple[str, str]] = []

    real = parts_module.match_answer

    def checker(response: str, answer: str) -> bool:
        checked.append((response, answer))
        return real(response, answer)

    monkeypatch.setattr(parts_module, "match_answer", checker)
    sets = {"model.student": student, "model.teachers.default": teacher, "data.path": train, "data.eval_path": evals,
            "model.device": "cpu", "model.dtype": "float32", "steps": 2, "checkpoint_every": 0,
            "data.max_prompt_len": 32, "rollout.max_response_len": 16, "rollout.prompts_per_step": 2,
            "rollout.samples_per_prompt": 2, "window.candidates": "[4, 8]", "probes.batch_size": 2,
            "probes.offers_per_step": 2, "eval.n_problems": 3, "eval.every": 0, "optim.warmup_steps": 0}
    argv = ["train", "--config", str(ROOT / "configs" / "byo-model.yaml"), "--out", str(tmp_path / "runs"),
            "--no-serve", "--no-progress"]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0
    run = tmp_path / "runs" / "byo-model"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    assert (run / "checkpoint-2" / "config.json").is_file()
    # every prompt went through the chat template of the tokenizer the run loads from the student folder
    # (AutoTokenizer: for a qwen2 config the Qwen2 tokenizer class over the saved vocabulary)
    loaded = load_tokenizer(student)
    bare = len(loaded("1+2=?", add_special_tokens=True)["input_ids"])
    templated = encode_prompts(loaded, ["1+2=?"], 32)[0]
    assert templated[0] == loaded.convert_tokens_to_ids("<|im_start|>") and len(templated) > bare + 10
    assert [r["rollout/prompt_tokens"] for r in rows] == [len(templated) * 4] * 2  # every prompt has 5 characters
    # the held-out answers were checked: start and end of the run, 3 problems each
    assert [a for _, a in checked] == ["1", "2", "3"] * 2
    summary = json.loads((run / "summary.json").read_text())
    assert 0.0 <= summary["accuracy_final"] <= 1.0

