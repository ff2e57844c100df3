"""The built-in task's character tokenizer: standard HF format, round trips, exact lengths."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from adwin.tasks import generate_samples, solution_for
from adwin.tasks.tokenizer import save_tokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tok")
    save_tokenizer(path)
    return path


def test_tokenizer_loads_with_auto_tokenizer_and_sets_special_tokens(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert (tok.pad_token, tok.bos_token, tok.eos_token) == ("<pad>", "<bos>", "<eos>")
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}) == 3
    assert tok.padding_side == "left"


def test_tokenizer_round_trips_prompts_and_solutions(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    for s in generate_samples(40, seed=0, split="eval"):
        text = s.prompt + solution_for(s)
        ids = tok(text)["input_ids"]
        assert ids[0] == tok.bos_token_id  # the post-processor prepends <bos>
        assert tok.unk_token_id not in ids
        assert tok.decode(ids, skip_special_tokens=True) == text
        # one token per character: lengths in tokens are exact
        assert len(ids) == len(text) + 1


def test_generator_response_lengths_make_windows_a_real_choice(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    lengths = [
        len(tok(solution_for(s), add_special_tokens=False)["input_ids"]) + 1  # + <eos>
        for s in generate_samples(1000, seed=0, split="eval")
    ]
    assert statistics.median(lengths) >= 96
    assert max(lengths) >= 256
    assert max(lengths) <= 320
