"""Character-level tokenizer of the built-in task, built with ``tokenizers`` and saved as a standard
Hugging Face tokenizer (``AutoTokenizer.from_pretrained(path)`` loads it).

One token per character keeps the vocabulary tiny (~40 ids), so a ~1M-parameter model learns the
digit tables fast, and makes response lengths exact: a response of ``k`` characters is ``k`` tokens.
``tokenizer(prompt)`` prepends ``<bos>`` (template post-processor); generation stops at ``<eos>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)  # ids 0, 1, 2, 3
# Every character the task writes, plus a little slack so stray text still tokenizes.
CHARACTERS = "0123456789abcdefghijklmnopqrstuvwxyz=:+-*\n ,.;#>?"


def build_tokenizer(model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """The character tokenizer; ``model_max_length`` is the models' positions (the long tasks' exceed 512)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # [\s\S]: every single character, including the newline that ends each step line
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters join with no separator
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",  # decoder-only generation pads on the left
        model_max_length=model_max_length,
    )


def save_tokenizer(path: str | Path, model_max_length: int = 512) -> PreTrainedTokenizerFast:
    tokenizer = build_tokenizer(model_max_length)
    tokenizer.save_pretrained(str(path))
    return tokenizer
