"""The generic recipe of docs/adapters.md, run verbatim, embedded and over HTTP; plus WindowClient units."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from tiny_models import make_tiny_llama, padded_copy

from adwin.controller import Controller
from adwin.controller.schemas import PolicyIn, RunIn
from adwin.trainer_adapters.generic import HeldProbe, WindowClient, build_probe_batch, pack, teacher_scorer

DOC = Path(__file__).resolve().parents[2] / "docs" / "adapters.md"
PAD, EOS = 0, 2


def recipe_source() -> str:
    """The first python block after the 'Generic recipe' heading."""
    text = DOC.read_text()
    section = text[text.index("## Generic recipe") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "docs/adapters.md lost its generic recipe block"
    return match.group(1)


def test_recipe_block_is_at_most_30_lines() -> None:
    lines = [ln for ln in recipe_source().splitlines() if ln.strip()]
    assert len(lines) <= 30, f"the generic recipe grew to {len(lines)} lines"


def _namespace(steps: int, teacher_rows: int = 64) -> dict:
    student = make_tiny_llama(seed=0)
    teacher = make_tiny_llama(seed=1)
    if teacher_rows != 64:
        teacher = padded_copy(teacher, teacher_rows)
    student.train()
    gen = torch.Generator().manual_seed(0)
    batches = [[torch.randint(3, 64, (3 + (i + b) % 3,), generator=gen).tolist() for i in range(4)] for b in range(steps)]
    return {
        "student": student,
        "teacher": teacher,
        "optimizer": torch.optim.AdamW(student.parameters(), lr=1e-3),
        "prompt_batches": batches,
        "PAD": PAD,
        "EOS": EOS,
    }


def _check_recipe_ran(ns: dict) -> None:
    client: WindowClient = ns["client"]
    windows: list[int] = ns["windows"]
    # Before any audit the adaptive policy starts at its largest candidate.
    assert windows[0] == 8
    telemetry = client.controller.telemetry("recipe")
    decided = [d for d in telemetry.decisions if d["reason"] == "audit"]
    assert decided, "no audit reached the controller"
    assert client.stats.audits == len(decided)
    # Each audit's decision is the window the loop used from the next step on.
    first = decided[0]
    assert windows[first["step"] + 1] == first["window"]
    cos = {int(k): float(v) for k, v in first["cosines"].items()}
    expected = min((c for c in (4, 8) if cos[c] >= 0.05), default=16)
    assert first["window"] == expected
    assert len(telemetry.steps) == len(windows)
    assert telemetry.steps[-1]["metrics"]["probe/audits"] >= 1


def test_generic_recipe_runs_verbatim_embedded() -> None:
    ns = _namespace(steps=4)
    exec(compile(recipe_source(), str(DOC), "exec"), ns)
    _check_recipe_ran(ns)


def test_a_teacher_padded_wider_than_the_student_trains_the_recipe_as_the_unpadded_teacher() -> None:
    """Qwen2.5-7B teaching 1.5B: the teacher's output layer has padding rows past the shared tokenizer. Read on the
    student's columns, a teacher with 32 large padding rows scores, audits and trains exactly as without them."""
    runs = []
    for rows in (64, 96):
        ns = _namespace(steps=4, teacher_rows=rows)
        exec(compile(recipe_source(), str(DOC), "exec"), ns)
        _check_recipe_ran(ns)
        decided = [(d["step"], d["window"], d["cosines"]) for d in ns["client"].controller.telemetry("recipe").decisions]
        losses = [s["metrics"]["loss"] for s in ns["client"].controller.telemetry("recipe").steps]
        runs.append((ns["windows"], decided, losses))
    (windows, decided, losses), (wide_windows, wide_decided, wide_losses) = runs
    assert wide_windows == windows
    assert [d[:2] for d in wide_decided] == [d[:2] for d in decided]
    for (_, _, cos), (_, _, wide_cos) in zip(decided, wide_decided, strict=True):
        assert {k: pytest.approx(v, abs=1e-4) for k, v in (cos or {}).items()} == (wide_cos or {})
    assert wide_losses == pytest.approx(losses, rel=1e-4)


def test_generic_recipe_runs_verbatim_against_remote_controller(remote_url: str) -> None:
    source = recipe_source()
    assert "Controller()" in source
    remote = source.replace("Controller()", f"__import__('adwin.controller').controller.RemoteController({remote_url!r})")
    ns = _namespace(steps=3)
    exec(compile(remote, str(DOC), "exec"), ns)
    _check_recipe_ran(ns)


# --- WindowClient units ---------------------------------------------------------------------------


def _fake_extend(token: int, eos_after: int | None = None):
    """Deterministic extender: appends ``token`` up to the budget, EOS once a context reaches a length."""

    def extend(contexts: list[list[int]], budgets: list[int]) -> tuple[list[list[int]], list[bool]]:
        out, done = [], []
        for c, b in zip(contexts, budgets, strict=True):
            toks = [token] * b
            if eos_after is not None and len(c) + b >= eos_after:
                toks = [token] * max(0, eos_after - len(c) - 1) + [EOS]
            out.append(toks)
            done.append(bool(toks) and toks[-1] == EOS)
        return out, done

    return extend


def test_offer_with_the_papers_rule_skips_finished_rollouts_below_the_horizon() -> None:
    ctrl = Controller()
    client = WindowClient(ctrl, RunIn(policy=PolicyIn(candidates=[2, 4], max_len=6), offers_per_step=8),
                          offer_finished="at_horizon")
    accepted = client.offer(0, [[5], [6]], [[9, 9], [9, EOS]], version=0, finished=[False, True], window=4)
    assert accepted == [f"{client.run_id}:0:0"]
    assert client.probes[accepted[0]].response_ids == [9, 9]
    assert client.probes[accepted[0]].versions == [0, 0] and not client.probes[accepted[0]].finished


@pytest.mark.parametrize("offer_finished", ["at_horizon", "always"])
def test_offer_at_the_full_horizon_offers_finished_and_full_length_rollouts_as_complete(offer_finished: str) -> None:
    ctrl = Controller()
    client = WindowClient(ctrl, RunIn(policy=PolicyIn(candidates=[2, 4], max_len=6), offers_per_step=8,
                                      probe_batch_size=2), offer_finished=offer_finished)
    accepted = client.offer(0, [[6], [7]], [[9, EOS], [9] * 6], version=0, finished=[True, False], window=6)
    assert accepted == [f"{client.run_id}:0:0", f"{client.run_id}:0:1"]
    assert all(client.probes[pid].finished for pid in accepted)
    calls: list[int] = []
    assert client.extend_probes(1, lambda c, b: (calls.append(len(c)), ([[]] * len(c), [False] * len(c)))[1],
                                version=1) == 0
    assert calls == []  # complete probes generate nothing
    assert ctrl.telemetry(client.run_id).probes["complete"] == 2
    assert ctrl.next_probe_batch(client.run_id, step=1) is not None


def test_offer_always_offers_finished_rollouts_below_the_horizon_too() -> None:
    ctrl = Controller()
    client = WindowClient(ctrl, RunIn(policy=PolicyIn(candidates=[2, 4], max_len=6), offers_per_step=8))
    accepted = client.offer(0, [[5], [6]], [[9, 9], [9, EOS]], version=0, finished=[False, True], window=4)
    assert accepted == [f"{client.run_id}:0:0", f"{client.run_id}:0:1"]
    assert [client.probes[pid].finished for pid in accepted] == [False, True]
    assert client.offer(1, [[5], [6]], [[9, 9], [9, 9]], version=1, window=4, limit=1) == [f"{client.run_id}:1:0"]


def test_offer_finished_must_name_a_rule() -> None:
    with pytest.raises(ValueError, match="offer_finished"):
        WindowClient(Controller(), RunIn(policy=PolicyIn(candidates=[2, 4], max_len=6)), offer_finished="never")


def test_extend_probes_grows_by_window_and_forces_stale_probes_to_full_length() -> None:
    ctrl = Controller()
    spec = RunIn(policy=PolicyIn(name="fixed", window=2, candidates=[2, 4], max_len=10), staleness_limit=2)
    client = WindowClient(ctrl, spec)
    (pid,) = client.offer(0, [[5, 5]], [[9, 9]], version=0)
    assert client.extend_probes(1, _fake_extend(7), version=1) == 2  # window 2 per round
    assert client.probes[pid].response_ids == [9, 9, 7, 7]
    assert client.probes[pid].versions == [0, 0, 1, 1]
    assert ctrl.telemetry(client.run_id).probes.get("active") == 1
    # step 2: staleness 2 - 0 reaches S = 2 -> forced to the full horizon in one round
    assert client.extend_probes(2, _fake_extend(8), version=2) == 6
    assert len(client.probes[pid].response_ids) == 10
    assert ctrl.telemetry(client.run_id).probes.get("complete") == 1


def test_extend_probes_marks_eos_finished_probes_complete() -> None:
    ctrl = Controller()
    client = WindowClient(ctrl, RunIn(policy=PolicyIn(name="fixed", window=4, candidates=[2], max_len=50)))
    (pid,) = client.offer(0, [[5]], [[9]], version=0)
    client.extend_probes(1, _fake_extend(7, eos_after=4), version=1)
    assert client.probes[pid].finished and client.probes[pid].response_ids[-1] == EOS
    assert ctrl.telemetry(client.run_id).probes.get("complete") == 1


def test_audit_and_submit_refuses_candidates_other_than_the_runs() -> None:
    ctrl = Controller()
    client = WindowClient(ctrl, RunIn(policy=PolicyIn(candidates=[2, 4], max_len=8)))
    batch = build_probe_batch([HeldProbe([3, 4], [5, 6, 7], [0, 0, 0])], teacher_scorer(make_tiny_llama(seed=1)), pad_id=PAD)
    with pytest.raises(ValueError, match="differ"):
        client.audit_and_submit(make_tiny_llama(), batch, 0, candidates=[2, 8])


def test_pack_right_pads_and_scores_only_response_tokens() -> None:
    teacher = make_tiny_llama(seed=1)
    batch = pack([[3, 4], [5]], [[6, 7], [8, 9, 10]], teacher_scorer(teacher), pad_id=PAD, versions=[[1, 1], [2, 2, 3]])
    assert batch.input_ids.tolist() == [[3, 4, 6, 7], [5, 8, 9, 10]]
    assert batch.response_mask.tolist() == [[0, 0, 1, 1], [0, 1, 1, 1]]
    assert batch.versions is not None and batch.versions.tolist() == [[-1, -1, 1, 1], [-1, 2, 2, 3]]
    with torch.no_grad():
        logq = torch.log_softmax(teacher(input_ids=batch.input_ids[:1]).logits[0, 1], -1)[6]
    assert torch.allclose(batch.teacher_logprobs[0, 2], logq, atol=1e-5)
    assert (batch.teacher_logprobs[batch.response_mask == 0] == 0).all()


def test_finished_probes_past_the_staleness_limit_are_forgotten_like_the_controller_expires_them() -> None:
    ctrl = Controller()
    spec = RunIn(policy=PolicyIn(name="fixed", window=2, candidates=[2, 4], max_len=10), staleness_limit=2,
                 probe_batch_size=3)
    client = WindowClient(ctrl, spec)
    (pid,) = client.offer(0, [[5, 5]], [[9, 9]], version=0)
    client.extend_probes(2, _fake_extend(8), version=2)  # staleness 2 = S: forced complete, no batch of 3
    assert client.probes[pid].finished and client.stats.expired == 0
    client.extend_probes(3, _fake_extend(8), version=3)  # staleness 3 > S: no batch can take it any more
    assert pid not in client.probes and client.stats.expired == 1
    assert client.metrics()["probe/expired"] == 1.0
    assert ctrl.next_probe_batch(client.run_id) is None
    assert ctrl.telemetry(client.run_id).probes["expired"] == 1


def test_expiring_most_probes_warns_once_with_the_cause_and_the_fix(caplog) -> None:
    ctrl = Controller()
    spec = RunIn(policy=PolicyIn(name="fixed", window=2, candidates=[2, 4], max_len=10), staleness_limit=1,
                 probe_batch_size=20, offers_per_step=8)
    client = WindowClient(ctrl, spec)
    with caplog.at_level(logging.WARNING, logger="adwin.probes.client"):
        for start in (0, 3):
            client.offer(start, [[5]] * 8, [[9, 9]] * 8, version=start, window=2)
            client.extend_probes(start + 1, _fake_extend(8), version=start + 1)  # staleness 1 = S: forced complete
            client.extend_probes(start + 2, _fake_extend(8), version=start + 2)  # past S: expired, no batch of 20
    assert client.stats.expired == 16
    warnings = [r.getMessage() for r in caplog.records if "expired before an audit batch" in r.getMessage()]
    assert len(warnings) == 1 and "probe_batch_size=20" in warnings[0] and "staleness_limit=1" in warnings[0]


def test_audit_keyword_arguments_go_over_the_clients_audit_config_and_are_checked_like_it() -> None:
    from pydantic import ValidationError

    from adwin.config import AuditConfig

    client = WindowClient(Controller(), RunIn(policy=PolicyIn(candidates=[2, 4], max_len=8)),
                          audit=AuditConfig(ci_level=0.9, every=2, budget=None))
    s = client._settings({"method": "reference", "micro_batch": 2})
    assert (s.method, s.ci_level, s.micro_batch, s.candidates) == ("reference", 0.9, 2, [2, 4])
    assert client.probe_client.schedule is not None and client.probe_client.schedule.every == 2
    with pytest.raises(ValidationError, match="method"):
        client._settings({"method": "bogus"})
