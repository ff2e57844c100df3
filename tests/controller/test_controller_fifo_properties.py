"""Property tests of the probe scheduler against a plain reference model (in-process controller)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from adwin.controller import Controller
from adwin.controller.schemas import OfferIn, PolicyIn, ProbeOfferItem, ProbeReportIn, RunIn

# an event: ("offer", n) | ("finish", k) | ("drop", k); k picks one of the active probes.
# After every event the scheduler is asked for a batch and must agree with the reference.
events = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(1, 6)),
        st.tuples(st.sampled_from(["finish", "finish", "finish", "drop"]), st.integers(0, 50)),
    ),
    min_size=5,
    max_size=40,
)


def _reference_batch(queue: list[tuple[str, str]], p: int, lookahead: int) -> list[str] | None:
    """queue: (probe_id, state) in submission order, non-dropped and not yet batched."""
    head = queue[: p + lookahead]
    ready = [pid for pid, state in head if state == "complete"]
    return ready[:p] if len(ready) >= p else None


@settings(max_examples=80, deadline=None)
@given(events=events, p=st.integers(1, 3), lookahead=st.integers(0, 3), cap=st.integers(1, 8), per_step=st.integers(1, 5))
def test_scheduler_matches_the_windowed_fifo_reference(events, p, lookahead, cap, per_step):
    ctrl = Controller()
    rid = ctrl.register_run(
        # S out of reach: this property is the FIFO rule alone (test_controller_staleness covers S)
        RunIn(policy=PolicyIn(candidates=[4, 8], max_len=16), probe_batch_size=p, lookahead=lookahead,
              max_active_probes=cap, offers_per_step=per_step, staleness_limit=10_000)
    ).run_id
    queue: list[tuple[str, str]] = []  # reference: submission order, not dropped, not batched
    n_offered = 0
    for step, (kind, arg) in enumerate(events):
        if kind == "offer":
            items = [ProbeOfferItem(sample_id=f"q{n_offered + i}", prompt_id="p", response_len=1, version=step) for i in range(arg)]
            n_offered += arg
            out = ctrl.offer_probes(rid, OfferIn(step=step, offers=items))
            active = sum(1 for _, s in queue if s == "active")
            assert len(out.accepted) == min(arg, per_step, max(0, cap - active))
            assert out.accepted == sorted(out.accepted, key=lambda s: int(s[1:]))
            queue += [(pid, "active") for pid in out.accepted]
        elif kind in ("finish", "drop"):
            active = [i for i, (_, s) in enumerate(queue) if s == "active"]
            if not active:
                continue
            i = active[arg % len(active)]
            pid = queue[i][0]
            ctrl.report_probe(rid, ProbeReportIn(probe_id=pid, step=step, tokens_added=1, version=step,
                                                 finished=kind == "finish", dropped=kind == "drop"))
            if kind == "drop":
                del queue[i]
            else:
                queue[i] = (pid, "complete")
        # after every event, ask for a batch: it must agree with the reference
        expected = _reference_batch(queue, p, lookahead)
        got = ctrl.next_probe_batch(rid)
        assert (got.probe_ids if got else None) == expected
        if expected:
            queue = [(pid, s) for pid, s in queue if pid not in expected]
        counts = ctrl.telemetry(rid).probes
        assert counts["active"] <= cap
    ctrl.close()
