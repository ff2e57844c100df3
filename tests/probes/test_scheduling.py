"""Probe scheduling seen from the trainer's side: windowed-FIFO batches under synthetic length distributions
(with async thread rounds), the bound on active probes, and seeded, recorded selection."""

from __future__ import annotations

import random

import pytest
import torch
from client_rounds import advance

from adwin.controller import Controller
from adwin.controller.schemas import OfferIn, PolicyIn, ProbeOfferItem, RunIn
from adwin.loop.accounting import TokenLedger
from adwin.loop.probing import ProbeSide
from adwin.probes.async_executor import AsyncProbeExecutor
from adwin.probes.client import ProbeClient
from adwin.probes.pool import Extension, Probe, ProbePool
from adwin.probes.workers import InlineWorker, ThreadWorker
from adwin.sampling.batch import Batch
from adwin.sampling.data import Prompt
from adwin.sampling.rollout import layout

EOS, MAX_LEN, W = 2, 64, 8


class LengthExtender:
    """Probe ``i`` (its prompt is ``[100 + i]``) ends with EOS once its response reaches ``lengths[i]``."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths

    def __call__(self, contexts: list[list[int]], budgets: list[int]) -> Extension:
        toks, lps, fin = [], [], []
        for ctx, n in zip(contexts, budgets, strict=True):
            have, want = len(ctx) - 1, self.lengths[ctx[0] - 100]
            k = min(n, max(0, want - have))
            done = have + k >= want and k > 0
            toks.append([7] * (k - 1) + [EOS] if done else [7] * k)
            lps.append([-1.0] * len(toks[-1]))
            fin.append(done)
        return Extension(toks, lps, fin)


@pytest.mark.parametrize(("backend", "lookahead", "seed"), [("inline", 0, 0), ("inline", 3, 1), ("thread", 2, 2)])
def test_short_probes_never_overtake_long_ones_by_more_than_the_lookahead(backend: str, lookahead: int,
                                                                           seed: int) -> None:
    rng = random.Random(seed)
    n, p, per_step = 48, 4, 4
    # heavy-tailed lengths: most probes end within a round or two, a few run to the horizon
    lengths = [min(MAX_LEN, max(1, int(rng.lognormvariate(2.3, 0.9)))) for _ in range(n)]
    ctl = Controller()
    run_id = ctl.register_run(RunIn(policy=PolicyIn(name="fixed", window=W, max_len=MAX_LEN), probe_batch_size=p,
                                    staleness_limit=1000, offers_per_step=per_step, max_active_probes=n,
                                    lookahead=lookahead)).run_id
    pool = ProbePool(MAX_LEN)
    ext = LengthExtender(lengths)
    spawn = (lambda: InlineWorker(ext)) if backend == "inline" else (lambda: ThreadWorker(ext))
    ex = AsyncProbeExecutor(pool, spawn)
    order: list[str] = []  # submission order
    batched: list[list[str]] = []
    step = 0
    while len(batched) * p < n:
        if len(order) < n:
            ids = [f"q{i}" for i in range(len(order), len(order) + per_step)]
            offers = [ProbeOfferItem(sample_id=i, prompt_id=i, response_len=0, version=step) for i in ids]
            assert ctl.offer_probes(run_id, OfferIn(step=step, offers=offers)).accepted == ids
            for i in ids:
                pool.add(Probe(i, [100 + int(i[1:])], [], [], [], "default", submitted_step=step))
            order += ids
        advance(ex, ctl, run_id, step + 1)
        for slot in ex.slots:
            if slot.future is not None:
                slot.future.exception(timeout=10)
        advance(ex, ctl, run_id, step + 1)  # collect what finished; nothing is left waiting on a worker
        while (ready := ctl.next_probe_batch(run_id)) is not None:
            done = {pid for b in batched for pid in b}
            head = [pid for pid in order if pid not in done]  # unbatched, in submission order
            allowed = set(head[: p + lookahead])
            assert set(ready.probe_ids) <= allowed, f"{ready.probe_ids} overtook beyond look-ahead {lookahead}"
            assert all(pool.get(pid).finished for pid in ready.probe_ids)
            batched.append(ready.probe_ids)
            pool.pop(ready.probe_ids)
        step += 1
        assert step < 200
    ex.close()
    audited = [lengths[int(pid[1:])] for b in batched for pid in b]
    assert sorted(audited) == sorted(lengths)  # every probe audited once: long ones are not left behind
    if lookahead == 0:
        assert [pid for b in batched for pid in b] == order  # strict submission order
    completion_first = sorted(range(n), key=lambda i: (lengths[i] + W - 1) // W)[: n // 2]  # arrival order
    first_half = audited[: n // 2]
    # what the look-ahead protects against: arrival order would audit the shortest half first
    assert sum(first_half) > sum(lengths[i] for i in completion_first)


def _batch(n: int, finished: list[bool]) -> tuple[Batch, torch.Tensor]:
    prompts = [Prompt(id=f"p{b // 2}", prompt="x") for b in range(n)]
    prompt_ids, response_ids = [[1, 5]] * n, [[7, 7, 7]] * n
    rows = layout(prompt_ids, response_ids, 0)
    return Batch(prompts, prompt_ids, response_ids, finished, rows), torch.full(rows.input_ids.shape, -1.0)


def test_offers_past_the_active_bound_are_declined_and_counted() -> None:
    ctl = Controller()
    run_id = ctl.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=[4, 8], max_len=16), probe_batch_size=2,
                                    staleness_limit=5, offers_per_step=10, max_active_probes=3)).run_id
    pool = ProbePool(16)
    side = ProbeSide(ProbeClient(ctl, run_id, pool, 5), TokenLedger(16))
    batch, behavior = _batch(6, [False] * 5 + [True])  # 5 unfinished prefixes offered, 1 finished is not
    m = side.offer(0, batch, behavior, window=8)
    assert (m["probe/offered"], m["probe/accepted"]) == (5, 3) and len(pool) == 3
    m = side.offer(1, batch, behavior, window=8)
    assert (m["probe/offered"], m["probe/accepted"]) == (5, 0) and len(pool) == 3  # never queued beyond the bound
    assert ctl.telemetry(run_id).probes["declined"] == 2 + 5


def test_finished_rollouts_are_offered_as_complete_probes_only_when_asked() -> None:
    ctl = Controller()
    run_id = ctl.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=[4, 8], max_len=16), probe_batch_size=2,
                                    staleness_limit=5, offers_per_step=10, max_active_probes=100)).run_id
    batch, behavior = _batch(4, [True, True, True, False])  # a window most rollouts fit into
    paper = ProbeSide(ProbeClient(ctl, run_id, ProbePool(16), 5, offer_finished="at_horizon"), TokenLedger(16))
    assert paper.offer(0, batch, behavior, window=8)["probe/offered"] == 1  # the paper's rule
    pool = ProbePool(16)
    always = ProbeSide(ProbeClient(ctl, run_id, pool, 5, offer_finished="always"), TokenLedger(16))
    m = always.offer(1, batch, behavior, window=8)
    assert m["probe/offered"] == 4 and len(pool) == 4
    finished = [pool.get(f"s1-{b}").finished for b in range(4)]
    assert finished == [True, True, True, False]  # finished ones need no extension; the unfinished one does


@pytest.mark.parametrize("selection", ["uniform", "stratified"])
def test_selection_is_seeded_and_recorded(selection: str) -> None:
    def accepted(seed: int) -> tuple[list[str], list[dict]]:
        ctl = Controller()
        run_id = ctl.register_run(RunIn(policy=PolicyIn(name="adwin", candidates=[4, 8], max_len=16),
                                        offers_per_step=3, max_active_probes=100, selection=selection,
                                        seed=seed)).run_id
        out = []
        for step in range(4):
            offers = [ProbeOfferItem(sample_id=f"s{step}-{i}", prompt_id=f"p{i // 4}", response_len=1, version=step)
                      for i in range(16)]
            out += ctl.offer_probes(run_id, OfferIn(step=step, offers=offers)).accepted
        rows = [dict(r) for r in ctl._store.all("SELECT * FROM offers WHERE run_id=? ORDER BY seq", (run_id,))]
        return out, rows

    first, rows = accepted(7)
    again, _ = accepted(7)
    other, _ = accepted(8)
    assert first == again and first != other
    assert len(rows) == 4 and all(r["selection"] == selection and r["rng_seed"].startswith("7:") for r in rows)
    if selection == "stratified":  # 3 picks from 4 prompts: never two from one prompt
        for step in range(4):
            picked = [pid for pid in first if pid.startswith(f"s{step}-")]
            assert len({int(pid.split("-")[1]) // 4 for pid in picked}) == 3
