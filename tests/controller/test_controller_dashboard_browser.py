"""The dashboard in a real headless browser: the four charts draw from a seeded run's telemetry."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from controller_harness import finish, offers, run_spec

from adwin.controller import Controller
from adwin.controller.app import serve_in_thread
from adwin.controller.schemas import AuditIn, StepMetricsIn

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed at /usr/bin/chromium")


def _seed(ctrl: Controller) -> str:
    """A short run: steps with the trainer's metric keys, and three decided audits."""
    rid = ctrl.register_run(run_spec(run_id="browser-run", name="browser-run-name", probe_batch_size=2)).run_id
    cosines = [{4: 0.3, 8: 0.6, 16: 0.9}, {4: 0.5, 8: 0.75, 16: 0.95}, {4: 0.72, 8: 0.85, 16: 0.97}]
    for step in range(12):
        w = ctrl.get_window(rid, step).window
        ctrl.report_step(rid, StepMetricsIn(step=step, metrics={
            "window/current": w, "rollout/sync_tokens": 8.0 * w, "rollout/full_equiv_tokens": 8.0 * 32,
            "probe/tokens": 20.0, "probe/staleness_max": float(step % 4), "probe/staleness_mean": (step % 4) / 2,
            "loss/total": 1.0 / (1 + step), "eval/accuracy": step / 12,
            **({"drift/survival_1_at_8": 0.9 - step / 40, "drift/ppl_8": 1.2 + step / 20} if step % 4 == 3 else {}),
        }))
        if step % 4 == 3:
            acc = ctrl.offer_probes(rid, offers(step, 2, prefix=f"st{step}-")).accepted
            for pid in acc:
                finish(ctrl, rid, pid, step=step)
            batch = ctrl.next_probe_batch(rid)
            cos = cosines[step // 4]
            ci = {c: (max(-1.0, v - 0.05), min(1.0, v + 0.05)) for c, v in cos.items()}  # audit.ci_level intervals
            noise = {f"noise_cos_{c}": (c / 32) ** 0.5 for c in cos}  # each candidate's pure-noise reading
            # the last audit's samples are far below the noise scale they measure: unresolved, the window holds
            signal = {"signal_z": 0.4, "noise_scale": 90.0, "evidence_samples": 2.0} if step == 11 else {}
            ctrl.submit_audit(rid, batch.audit_id, AuditIn(cosines=cos, cosine_ci=ci, stats=noise | signal))
    return rid


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "profile"
    cmd = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def test_run_page_draws_all_charts_in_headless_chromium(tmp_path):
    ctrl = Controller()
    rid = _seed(ctrl)
    url, stop = serve_in_thread(ctrl)
    try:
        dom = _chromium(tmp_path, "--virtual-time-budget=8000", "--dump-dom", f"{url}/runs/{rid}")
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        for chart in ("chart-window", "chart-cosines", "chart-loss", "chart-accuracy", "chart-staleness", "chart-tokens",
                      "chart-drift"):
            block = html.split(f'id="{chart}"', 1)[1].split('class="chart"', 1)[0]
            assert "main-svg" in block, f"{chart} did not draw"
            assert re.search(r'class="(js-line|scatterpts|point)', block), f"{chart} has no trace"
        assert 'data-drawn="' in html and "window <b>" in html
        cos_block = html.split('id="chart-cosines"', 1)[1].split('class="chart"', 1)[0]
        assert 'class="yerror"' in cos_block  # each audit's cosine interval as an error bar
        assert "w=4 pure noise" in cos_block  # each candidate's pure-noise reading beside its cosine
        assert re.search(r"changes per audit \d\.\d\d", html)
        assert "unresolved audits 1 of 3" in html  # the mark: audits whose evidence could not resolve the signal
        window_block = html.split('id="chart-window"', 1)[1].split('class="chart"', 1)[0]
        assert "unresolved (fallback)" in window_block
        assert "loss/total" in html and "eval/accuracy" in html  # the legends of the two new charts
        assert "— browser-run-name" in html  # the run's name ...
        assert re.search(r"policy adwin \(candidates=\[4, 8, 16\], threshold=0\.7, max_len=32", html)  # ... and policy
        assert re.search(r"last update: [^<]+ \(\d+ s ago\), newest step 11", html)
        assert re.findall(r'<div id="chart-[a-z]+"[^>]*data-empty="true"', html) == []  # every chart has data
        shot = Path(os.environ.get("ADWIN_SCREENSHOT_DIR", tmp_path)) / "dashboard.png"
        r = _chromium(tmp_path, "--virtual-time-budget=8000", f"--screenshot={shot}", "--window-size=1280,1600", f"{url}/runs/{rid}")
        assert r.returncode == 0 and shot.stat().st_size > 20_000, r.stderr[-2000:]
        index = _chromium(tmp_path, "--virtual-time-budget=2000", "--dump-dom", f"{url}/")
        assert f'href="/runs/{rid}"' in index.stdout
    finally:
        stop()
        ctrl.close()


def test_an_empty_run_says_no_data_yet_instead_of_drawing_blank_axes(tmp_path):
    ctrl = Controller()
    rid = ctrl.register_run(run_spec(run_id="empty-run")).run_id
    url, stop = serve_in_thread(ctrl)
    try:
        dom = _chromium(tmp_path, "--virtual-time-budget=8000", "--dump-dom", f"{url}/runs/{rid}")
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        for chart in ("chart-cosines", "chart-loss", "chart-accuracy", "chart-staleness", "chart-tokens", "chart-drift"):
            block = html.split(f'id="{chart}"', 1)[1].split('class="chart"', 1)[0]
            assert 'data-empty="true"' in block and "no data yet" in block, f"{chart} has no empty state"
        assert len(re.findall(r'<div id="chart-[a-z]+"[^>]*data-empty="true"', html)) == 6  # all but the window chart
        window = html.split('id="chart-window"', 1)[1].split('class="chart"', 1)[0]
        ticks = re.findall(r'class="[xy]tick"[^>]*>.*?<text[^>]*>([^<]*)</text>', window)
        assert ticks and not any(t.startswith("\u2212") or t.startswith("-") or ".5" in t for t in ticks), ticks
        assert "no step has been reported" in html and "newest step none" in html
        shot = Path(os.environ.get("ADWIN_SCREENSHOT_DIR", tmp_path)) / "empty.png"
        r = _chromium(tmp_path, "--virtual-time-budget=8000", f"--screenshot={shot}", "--window-size=1280,1600", f"{url}/runs/{rid}")
        assert r.returncode == 0 and shot.stat().st_size > 10_000, r.stderr[-2000:]
    finally:
        stop()
        ctrl.close()
