"""A lean one-token decode step for Llama students on CPU: the generation loop's eager cache where it applies.

On CPU a decode step of a small model costs its per-op overhead, not its arithmetic: transformers' forward runs a
few hundred small ops a token (mask building, a ``DynamicCache`` that concatenates every layer's keys and values
each step, module calls), ~10x what the step's arithmetic costs at the built-in long model's shape. ``LeanCache``
runs the same computation in about 20 ops per layer, in the style of gpt-fast's decode step, which leaves the
attention's read of the KV cache as most of a step at long lengths (docs/benchmarks.md, "The lean CPU decode step"):

- one preallocated KV buffer per layer, ``(2, rows, kv_heads, columns, head_dim)`` (keys, values), written one
  column a step (all rows share the write column; each row has its own RoPE position and padding mask);
- the model's own weights, read live at every call (q/k/v and gate/up concatenated once per ``decode`` call:
  the weight sync stays free, and a call always decodes the current student);
- RoPE as a table lookup of the model's own rotary embedding, applied to q, k and v in one pass; rotate-half(q)
  and rotate-half(k) come out of the q/k/v matmul itself (their rows, permuted and negated, ride along: the same
  dot products, so exact), the value heads get cos 1 and zero rows (exact);
- the prefill is the model's own forward (its logits and its cache, copied into the buffer once).

Rows that stop leave the buffer (``stop``; ``drop`` for the evaluation's compaction), so a finished row costs no
more steps; the loop still draws the sampler's noise for every row in place (the stopped rows' logits are their
last ones), so the batch's global-RNG draws are the eager loop's.

It applies to ``LlamaForCausalLM`` itself (by type, not a subclass, which may change the forward) with SiLU MLPs,
no biases and a static RoPE, in float32 on CPU (``lean_applies``); any other model decodes on its own cache as
before. The arithmetic is transformers' SDPA forward's (torch's fused ``rms_norm`` rounds as LlamaRMSNorm does in
float32; the fused matmuls compute the same dot products): tests/adwin/decode/test_lean.py pins the logits to a
tight tolerance (equal in practice) and the tokens to the eager loop's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

STATIC_ROPE = {"default", "linear", "llama3"}  # rope types whose table does not depend on the sequence length


class LeanModelError(TypeError):
    """The model is not one the lean step computes exactly (``lean_applies`` is False)."""


def _rope_type(config: object) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(params.get("rope_type", params.get("type", "default")))


def lean_applies(model: torch.nn.Module) -> bool:
    """Whether ``LeanCache`` decodes ``model``: a plain ``LlamaForCausalLM`` in float32 on CPU whose layers are the
    ones the lean step computes (SiLU, no biases, a static RoPE, no tensor-parallel slicing)."""
    try:
        from transformers import LlamaForCausalLM
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    if type(model) is not LlamaForCausalLM:
        return False
    cfg = model.config
    weight = next(model.parameters())
    if weight.device.type != "cpu" or weight.dtype != torch.float32:  # float32: the rounding the tests pin
        return False
    return (cfg.hidden_act == "silu" and not getattr(cfg, "attention_bias", False)
            and not getattr(cfg, "mlp_bias", False) and getattr(cfg, "pretraining_tp", 1) == 1
            and _rope_type(cfg) in STATIC_ROPE)


def _prefill_kv(cache: object, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values (rows, kv_heads, T, head_dim) of ``layer`` in the model's own returned cache."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return layers[layer].keys, layers[layer].values
    return cache.key_cache[layer], cache.value_cache[layer]  # type: ignore[attr-defined]


class LeanCache:
    """The generation loop's cache protocol (``adwin.decode.loop``: ``rows``, ``device``, ``logits``, ``step``,
    ``stop``, ``drop``) over a preallocated KV buffer and the lean step; see the module docstring."""

    def __init__(self, model: torch.nn.Module, contexts: Sequence[Sequence[int]], budget: int, pad_id: int) -> None:
        from adwin.decode.kv_cache import UncachedModelError, last_logits_only, left_pad, returned_cache

        if not lean_applies(model):
            raise LeanModelError(f"the lean decode step computes a plain LlamaForCausalLM on CPU, got "
                                 f"{type(model).__name__}")
        self.device = next(model.parameters()).device
        ids, mask = left_pad(contexts, pad_id, self.device)  # (b, T)
        self.rows, width = len(contexts), ids.shape[1]
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp_min(0),
                    use_cache=True, **last_logits_only(model))
        cache = returned_cache(out)
        if cache is None:
            raise UncachedModelError(f"{type(model).__name__} returned no KV cache (use_cache=True)")
        self.logits = out.logits[:, -1].float()  # (b, V)
        self._weights(model)
        columns = width + budget
        self.kv: list[torch.Tensor] = []  # per layer (2, b, kv_heads, columns, head_dim)
        for i in range(len(self.layers)):
            k, v = _prefill_kv(cache, i)  # (b, kv_heads, T, head_dim)
            buf = k.new_empty(2, self.rows, self.kv_heads, columns, self.head_dim)
            buf[0, :, :, :width] = k
            buf[1, :, :, :width] = v
            self.kv.append(buf)
        # (b, columns) SDPA's additive mask: 0 where a row attends, -inf elsewhere (columns not yet written)
        self.bias = torch.full((self.rows, columns), float("-inf"), dtype=self.embed.dtype, device=self.device)
        self.bias[:, :width].masked_fill_(mask.bool(), 0.0)
        self.column = width  # the column the next step writes
        self.positions = (mask.sum(dim=1) - 1).clamp_min(0)  # (b,) position of each row's last token
        self._rope_table(model, int(self.positions.max()) + budget + 1)
        self.held: torch.Tensor | None = None  # (b',) the loop rows the buffer holds; None: all of them, in order
        self.out = self.logits  # (rows, V) what a step returns: the held rows' new logits, the others' last ones

    def _weights(self, model: torch.nn.Module) -> None:
        """The model's live weights, per layer: the norms, o, down, gate/up concatenated, and q/k/v concatenated
        with the rows of rotate-half(q) and rotate-half(k) (a signed permutation of q's and k's rows: the matmul
        computes ``rotate_half(q)`` exactly) and zero rows for the values. Built at every call, so a call decodes
        the current student."""
        base = model.model
        attn = base.layers[0].self_attn
        self.heads, self.kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.embed, self.final_norm = base.embed_tokens.weight, base.norm.weight
        self.eps, self.lm_head = base.norm.variance_epsilon, model.lm_head.weight
        half = self.head_dim // 2

        def rotated(w: torch.Tensor) -> torch.Tensor:  # (heads * head_dim, hidden) -> rows of rotate_half
            heads = w.view(-1, self.head_dim, w.shape[-1])
            return torch.cat([-heads[:, half:], heads[:, :half]], dim=1).reshape(w.shape)

        self.layers = []
        for layer in base.layers:
            a, mlp = layer.self_attn, layer.mlp
            qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight, rotated(a.q_proj.weight),
                             rotated(a.k_proj.weight), torch.zeros_like(a.v_proj.weight)])
            self.layers.append((layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, qkv,
                                a.o_proj.weight, layer.post_attention_layernorm.weight,
                                layer.post_attention_layernorm.variance_epsilon,
                                torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]), mlp.down_proj.weight))

    def _rope_table(self, model: torch.nn.Module, positions: int) -> None:
        """``cos`` per position for the q, k and v heads (P, heads + 2 * kv_heads, head_dim) and ``sin``
        (P, 1, head_dim), from the model's own rotary embedding; the value heads' cos is 1 (their rotated rows are
        zero): ``x * cos + rotated * sin`` leaves them exactly as they are."""
        pos = torch.arange(positions, device=self.device)[None]  # (1, P)
        cos, sin = model.model.rotary_emb(self.embed[:1][None], pos)  # (1, P, head_dim)
        rot_heads = self.heads + self.kv_heads
        self.cos = cos.new_ones(positions, rot_heads + self.kv_heads, self.head_dim)
        self.cos[:, :rot_heads] = cos[0, :, None]
        self.sin = sin[0, :, None].contiguous()

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Decode ``tokens`` (rows,) at the next column; next-token logits (rows, V) float32 (rows the buffer no
        longer holds keep their last logits)."""
        held = self.held
        toks = tokens if held is None else tokens[held]  # (b,)
        self.positions = self.positions + 1
        logits = self._forward(toks).float()  # (b, V)
        self.column += 1
        if held is None:
            self.out = logits
        else:
            self.out[held] = logits
        return self.out

    def _forward(self, toks: torch.Tensor) -> torch.Tensor:
        """The model's forward of one token per row (b,) at ``positions``, writing column ``column``: logits (b, V)."""
        b, c, kvh, hd = toks.shape[0], self.column, self.kv_heads, self.head_dim
        nh = self.heads + 2 * kvh
        cos, sin = self.cos[self.positions], self.sin[self.positions]  # (b, all heads, hd), (b, 1, hd)
        self.bias[:, c] = 0.0
        bias = self.bias[:, None, None, : c + 1]  # (b, 1, 1, c + 1) 0 where a row attends, -inf elsewhere
        gqa = self.heads != kvh
        x = F.embedding(toks, self.embed)  # (b, hidden)
        for (ln1, eps1, wqkv, wo, ln2, eps2, wgu, wdown), kv in zip(self.layers, self.kv, strict=True):
            both = F.linear(F.rms_norm(x, ln1.shape, ln1, eps1), wqkv).view(b, 2 * nh, hd)  # (b, 2 * all heads, hd): x, rotated
            qkv = both[:, :nh] * cos + both[:, nh:] * sin  # (b, all heads, hd)
            kv[:, :, :, c] = qkv[:, self.heads :].view(b, 2, kvh, hd).transpose(0, 1)
            att = F.scaled_dot_product_attention(qkv[:, : self.heads, None], kv[0, :, :, : c + 1],
                                                 kv[1, :, :, : c + 1], attn_mask=bias, scale=self.scaling,
                                                 enable_gqa=gqa)  # (b, heads, 1, hd)
            x = x + F.linear(att.view(b, self.heads * hd), wo)
            gate, up = F.linear(F.rms_norm(x, ln2.shape, ln2, eps2), wgu).chunk(2, dim=-1)  # (b, intermediate) each
            x = x + F.linear(F.silu(gate) * up, wdown)
        return F.linear(F.rms_norm(x, self.final_norm.shape, self.final_norm, self.eps), self.lm_head)  # (b, V)

    def _keep(self, idx: torch.Tensor) -> None:
        """Keep buffer rows ``idx`` (b',), in order: their used columns move to a smaller buffer."""
        c = self.column
        for i, buf in enumerate(self.kv):
            small = buf.new_empty(2, len(idx), *buf.shape[2:])
            small[:, :, :, :c] = buf[:, idx, :, :c]
            self.kv[i] = small
        self.bias, self.positions = self.bias[idx], self.positions[idx]

    def stop(self, rows: list[int]) -> None:
        """Loop rows ``rows`` stopped (they keep their place in the loop's batch): they leave the buffer."""
        held = self.held.tolist() if self.held is not None else list(range(self.rows))
        gone = set(rows)
        keep = [i for i, r in enumerate(held) if r not in gone]
        if len(keep) == len(held):
            return
        if self.held is None:
            self.out = self.out.clone()  # the loop's last logits become the stopped rows' logits
        self._keep(torch.tensor(keep, dtype=torch.long, device=self.device))
        self.held = torch.tensor([held[i] for i in keep], dtype=torch.long, device=self.device)

    def drop(self, keep: torch.Tensor, gone: list[int]) -> bool:
        """The loop's batch becomes rows ``keep`` (b',) of it (``drop_stopped``)."""
        assert self.held is None, "the loop either stops rows in place or drops them, never both"
        self._keep(keep)
        self.rows = len(keep)
        return True
