"""The student's generator: ``generate`` continues token contexts by per-row budgets.

It is the one entry point of the batch decoders above ``adwin.decode`` (rollouts, probe rounds, evaluation
without compaction, the generic adapter's extender, ``HFEngine``): the one generation loop
(``adwin.decode.loop.decode``) with the shared sampler, or transformers' own ``generate`` where only it can
do what is asked (``hf_generate``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from adwin.decode.loop import Generation, decode, left_pad
from adwin.decode.sampler import SamplingError, TokenSampler
from adwin.decode.static_cache import (
    CompileSetting,
    compile_wanted,
    generate_kwargs,
    lays_rows,
    pad_rows,
    stop_dummy_rows,
)

# transformers' generate fills every setting a call leaves unset from the checkpoint's generation_config.json. These
# would add logits processors or change the search (a repetition penalty, n-gram bans, a minimum length, beams), so
# under the shared sampler they are pinned to their no-op values: generate's tokens are then the eager loop's, which
# reads no generation config.
NEUTRAL_GENERATION: dict[str, Any] = {
    "num_beams": 1, "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": 0, "guidance_scale": 1.0,
    "renormalize_logits": False, "remove_invalid_values": False}


def generate(
    model: torch.nn.Module,
    contexts: Sequence[Sequence[int]],
    budgets: Sequence[int],
    *,
    eos: set[int],
    pad_id: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    with_logprobs: bool = False,
    sampling: Mapping[str, Any] | None = None,
    row_seeds: Sequence[int] | None = None,
    compile: CompileSetting = False,
) -> Generation:
    """Continue each context by at most ``budgets[b]`` tokens, rows cut at their first EOS (kept) or their budget.

    The one student generator: rollouts, evaluation, probe extension (``adwin.probes.extender``) and the
    generic adapter's ``hf_extender`` all call it. It runs the one generation loop (``adwin.decode.loop.decode``,
    every row keeping its place in the batch) with the shared sampler: ``temperature == 0`` decodes greedily,
    ``temperature``/``top_p`` alone define the sampling distribution. ``row_seeds`` (one per context) gives every
    row its own sampling noise (``rollout.seeding: per_sample``), so a row's tokens do not depend on the rest of
    the batch; without it the batch's noise comes from torch's global RNG, drawn as transformers' ``generate``
    draws it. The model samples in eval mode (no dropout: tokens come from the policy the loss and the audit
    evaluate) and gets its previous mode back. ``compile`` (``rollout.compile``; ``auto``: on CUDA) decodes on a
    static cache with transformers' compiled step (``adwin.decode.static_cache``).

    ``sampling`` replaces temperature/top-p with transformers ``generate`` arguments taken verbatim (an adapter
    following its host trainer's settings: top-k, penalties, the model's generation config): those only
    transformers' own ``generate`` implements, so such a call runs there (``hf_generate``), as does a compiled
    call of a model whose static cache cannot lay rows (sliding-window layers).
    """
    if sampling is not None and (temperature != 1.0 or top_p != 1.0 or row_seeds is not None):
        raise ValueError("give temperature/top_p (and row_seeds) or sampling (HF generate arguments), not both")
    n = len(contexts)
    if row_seeds is not None and len(row_seeds) != n:
        raise SamplingError(f"row_seeds: {len(row_seeds)} seeds for {n} contexts")
    device = next(model.parameters()).device if n else torch.device("cpu")
    static = n > 0 and compile_wanted(compile, device)
    if sampling is not None or (static and not lays_rows(model)):
        return hf_generate(model, contexts, budgets, eos=eos, pad_id=pad_id, with_logprobs=with_logprobs,
                           sampling=sampling or {}, sampler=None if sampling is not None else TokenSampler(
                               temperature, top_p, row_seeds=row_seeds, device=device), static=static)
    sampler = TokenSampler(temperature, top_p, row_seeds=row_seeds, device=device)
    return decode(model, contexts, budgets, eos=eos, pad_id=pad_id, sampler=sampler, with_logprobs=with_logprobs,
                  static=static)


@torch.no_grad()
def hf_generate(model: torch.nn.Module, contexts: Sequence[Sequence[int]], budgets: Sequence[int], *, eos: set[int],
                pad_id: int, with_logprobs: bool, sampling: Mapping[str, Any], sampler: TokenSampler | None,
                static: bool) -> Generation:
    """transformers' ``generate`` on left-padded contexts: ``sampling`` verbatim, or ``sampler`` as its logits
    processor (greedy argmax of the sampler's scores is the sampler's token); ``static``: its static cache and
    compiled step, the batch filled with dummy rows that stop after their first token."""
    n = len(contexts)
    if n == 0:
        return Generation([], [], [] if with_logprobs else None)
    max_new = max(budgets)
    if max_new <= 0:
        return Generation([[] for _ in range(n)], [False] * n, [[] for _ in range(n)] if with_logprobs else None)
    device = next(model.parameters()).device
    if static:  # the batch's bucket: dummy rows after the real ones
        contexts, budgets, _ = pad_rows(contexts, budgets, None, pad_id)
        if sampler is not None and sampler.generators is not None:
            sampler.generators += [torch.Generator(device=device) for _ in range(len(contexts) - n)]
    ids, mask = left_pad(contexts, pad_id, device)  # (B, T)
    compiled = generate_kwargs(model, len(contexts), ids.shape[1], max_new) | {
        "stopping_criteria": stop_dummy_rows(n, len(contexts), device)} if static else {}
    if sampler is not None:
        from transformers import LogitsProcessorList

        sampling = NEUTRAL_GENERATION | {"do_sample": False} | ({} if sampler.greedy else {
            "logits_processor": LogitsProcessorList([sampler.logits_processor()])})
    was_training = model.training
    model.eval()
    try:
        out = model.generate(  # type: ignore[operator]
            input_ids=ids, attention_mask=mask,
            **{**sampling, **compiled, "max_new_tokens": max_new, "pad_token_id": pad_id, "eos_token_id": sorted(eos),
               "return_dict_in_generate": True, "output_logits": with_logprobs},
        )
    finally:
        model.train(was_training)
    new = out.sequences[:, ids.shape[1] :].tolist()  # (B, n_new)
    step_lp = None
    if with_logprobs and out.logits:
        logits = torch.stack(out.logits, dim=1).float()  # (B, n_new, V)
        step_lp = torch.log_softmax(logits, dim=-1).gather(-1, out.sequences[:, ids.shape[1] :, None]).squeeze(-1)
        step_lp = step_lp.tolist()  # (B, n_new)
    responses, finished, logprobs = [], [], []
    for b in range(n):  # dummy rows (b >= n) are dropped
        row = new[b][: max(budgets[b], 0)]
        stop = next((i for i, tok in enumerate(row) if tok in eos), None)
        cut = row if stop is None else row[: stop + 1]
        responses.append(cut)
        finished.append(stop is not None)
        if step_lp is not None:
            logprobs.append(step_lp[b][: len(cut)])
    return Generation(responses, finished, logprobs if with_logprobs else None, decode_steps=len(new[0]))
