"""The OAPL learner on a tiny Llama: its gradient against a hand-written eq. 3, its rewards, its guards."""

from __future__ import annotations

import math

import pytest
import torch
from numerics import assert_same_params
from tiny_models import make_tiny_llama

from adwin.config import TrainConfig, load_config
from adwin.trainer_adapters.asyncopd.items import StreamItem, TokenOut
from adwin.trainer_adapters.asyncopd.oapl import OAPLLearner

pytestmark = pytest.mark.numerics  # parity of numbers across code paths: rerun per CPU capability

PAD = 0


def make_items(specs: list[tuple[int, list[int], list[int]]], *, seed: int = 0, version: int = 3) -> list[StreamItem]:
    """(group, prompt ids, response ids) -> items with arbitrary behaviour and teacher log-probabilities."""
    gen = torch.Generator().manual_seed(seed)
    items = []
    for i, (group, prompt, response) in enumerate(specs):
        it = StreamItem(f"r{i}", i, f"p{group}", prompt, "default", 8, 8, False, version, group=group,
                        answer=str(group))
        for tok in response:
            it.append(TokenOut(tok, -float(torch.rand((), generator=gen)) * 3), version)
        it.teacher_logprobs = [-float(x) * 3 for x in torch.rand(len(response), generator=gen)]
        it.finish_reason = "eos"
        items.append(it)
    return items


SPECS = [(0, [1, 5, 6], [7, 8, 9]), (0, [1, 5, 6], [10, 2]), (4, [1, 11], [12, 13, 14, 15]),
         (4, [1, 11], [16]), (4, [1, 11], [17, 18])]


def oapl_config(extra: dict[str, object] | None = None, **options: object) -> TrainConfig:
    """A config whose ``loss.oapl`` holds ``options`` (a task reward reads whole responses: window policy full),
    with the overrides ``extra``."""
    return load_config(None, {"scheduler": "asyncopd", "loss.name": "oapl", "rollout.samples_per_prompt": 2,
                              "window.policy": "full"} | {f"loss.oapl.{k}": v for k, v in options.items()}
                       | (extra or {}))


def learner(model: torch.nn.Module, **options: object) -> OAPLLearner:
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    checker = options.pop("checker", None)
    decode = (lambda ids: " ".join(map(str, ids))) if checker else None
    return OAPLLearner(model, opt, None, oapl_config(**options), pad_id=PAD, width=12, checker=checker, decode=decode)


def response_logprob(model: torch.nn.Module, prompt: list[int], response: list[int]) -> torch.Tensor:
    """ln pi(y|x) of one unpadded sequence: the response tokens' log-softmax entries, summed by hand."""
    ids = torch.tensor([prompt + response])
    logp = torch.log_softmax(model(input_ids=ids).logits[0], dim=-1)  # (T, V)
    return sum(logp[len(prompt) - 1 + j, tok] for j, tok in enumerate(response))


def test_gradient_equals_the_hand_written_eq3_gradient_on_a_tiny_model() -> None:
    model = make_tiny_llama(seed=3).double()
    beta, beta_v = 0.7, 2.0
    items = make_items(SPECS)
    lrn = learner(model, beta=beta, value_beta=beta_v)
    loss, _, metrics = lrn.loss(items)
    loss.backward()
    got = [p.grad.clone() for p in model.parameters()]

    # d/dθ (1/N) Σ_i (β s_i - A_i)^2 = (2β/N) Σ_i (β s_i - A_i) ∇ ln π(y_i),  s_i = ln π(y_i) - ln π_inf(y_i)
    params = list(model.parameters())
    ref = [torch.zeros_like(p) for p in params]
    r = [sum(t - b for t, b in zip(it.teacher_logprobs, it.logprobs, strict=True)) for it in items]
    value = {g: beta_v * math.log(sum(math.exp(x / beta_v) for x, it in zip(r, items, strict=True) if it.group == g)
                                  / sum(1 for it in items if it.group == g)) for g in (0, 4)}
    n = len(items)
    for it, ri in zip(items, r, strict=True):
        lp = response_logprob(model, it.prompt_ids, it.tokens)
        residual = beta * (lp.item() - sum(it.logprobs)) - (ri - value[it.group])
        for acc, g in zip(ref, torch.autograd.grad(lp, params), strict=True):
            acc += 2 * beta * residual / n * g
    for a, b in zip(got, ref, strict=True):
        assert float((a - b).abs().max()) <= 1e-6 * (1 + float(b.abs().max()))  # item values are float32
    assert any(float(g.abs().max()) > 1e-4 for g in ref), "a vanishing gradient would prove nothing"
    assert metrics["oapl/groups"] == 2 and metrics["loss/tokens"] == sum(len(s[2]) for s in SPECS)


def test_task_and_weighted_rewards_enter_the_advantage() -> None:
    model = make_tiny_llama(seed=1)
    items = make_items(SPECS)
    correct = {0, 2, 3}  # items whose response the stub checker accepts
    accepted = {" ".join(map(str, items[i].tokens)) for i in correct}

    def checker(text: str, answer: str) -> bool:
        return text in accepted

    teacher = [sum(t - b for t, b in zip(it.teacher_logprobs, it.logprobs, strict=True)) for it in items]
    task = [1.0 if i in correct else 0.0 for i in range(len(items))]
    for options, want in (({"reward": "task"}, task),
                          ({"reward": "weighted", "task_weight": 2.0, "teacher_weight": 0.5},
                           [2 * a + 0.5 * b for a, b in zip(task, teacher, strict=True)]),
                          ({"reward": "teacher"}, teacher)):
        lrn = learner(model, beta=1.0, checker=checker, **options)
        _, terms, metrics = lrn.loss(items)
        v0 = math.log((math.exp(want[0]) + math.exp(want[1])) / 2)  # beta 1, group 0 = items 0 and 1
        assert terms.advantages[:2].tolist() == pytest.approx([want[0] - v0, want[1] - v0], rel=1e-5), options
        assert metrics["oapl/reward_mean"] == pytest.approx(sum(want) / len(want), rel=1e-5)


def test_task_reward_needs_answers_and_a_checker() -> None:
    model = make_tiny_llama()
    with pytest.raises(ValueError, match="checker"):
        OAPLLearner(model, torch.optim.SGD(model.parameters(), lr=0.0), None, oapl_config(reward="task"), pad_id=PAD,
                    width=None)
    items = make_items(SPECS)
    items[2].answer = None
    with pytest.raises(ValueError, match="has no answer"):
        learner(model, reward="task", checker=lambda t, a: True).loss(items)


def test_learner_refuses_a_group_sampled_by_two_inference_policies() -> None:
    model = make_tiny_llama()
    items = make_items(SPECS[:2]) + make_items(SPECS[2:], version=4)
    learner(model).loss(items)  # two groups, each from one policy: fine
    mixed = make_items(SPECS[:1]) + make_items(SPECS[1:2], version=4)  # one group, two policies
    with pytest.raises(ValueError, match="mixes inference policies"):
        learner(model).loss(mixed)
    straddling = make_items(SPECS[:2])
    straddling[0].append(TokenOut(3, -1.0), 4)  # a keep-mode breakpoint inside an item
    straddling[0].teacher_logprobs.append(-1.0)
    with pytest.raises(ValueError, match="mixes inference policies"):
        learner(model).loss(straddling)


def test_micro_batches_that_split_a_group_give_the_whole_batch_update() -> None:
    """Eq. 2's values come from the whole batch, so micro-batches of 2 rows (group 4 split over two of them)
    train exactly what one pass does."""
    def run(micro: int | None) -> tuple[dict[str, float], torch.nn.Module, list[int]]:
        model = make_tiny_llama(seed=3).double()
        rows: list[int] = []
        model.register_forward_pre_hook(lambda mod, args, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True)
        lrn = OAPLLearner(model, torch.optim.SGD(model.parameters(), lr=0.1), None,
                          oapl_config({"optim.micro_batch_size": micro}, beta=0.7), pad_id=PAD, width=12)
        return lrn.update(make_items(SPECS), 3), model, rows

    whole_m, whole, whole_rows = run(None)
    micro_m, micro, micro_rows = run(2)
    assert whole_rows == [5] and micro_rows == [2, 2, 1]
    assert_same_params(whole, micro)
    for key in ("loss/total", "optim/grad_norm", "oapl/residual_rms", "oapl/value_mean", "loss/is_ratio_p50",
                "loss/teacher_kl"):
        assert micro_m[key] == pytest.approx(whole_m[key], rel=1e-9, abs=1e-12), key
    assert whole_m["optim/skipped"] == micro_m["optim/skipped"] == 0.0
