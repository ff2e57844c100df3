"""Smoke test of ``adwin bench controller`` with tiny counts against a real server process."""

from __future__ import annotations

import json

from adwin.cli import build_parser


def test_bench_controller_tiny_reports_latency_throughput_and_audit_time(tmp_path, capsys):
    out = tmp_path / "bench.json"
    args = build_parser().parse_args(["bench", "controller", "--tiny", "--json", str(out)])
    assert args._module.main(args) == 0
    result = json.loads(out.read_text())
    for key in ("window_get_paced", "window_get_saturated"):
        w = result[key]
        assert w["requests"] == 200 and 0 < w["p50_ms"] <= w["p99_ms"] <= w["max_ms"] and w["throughput_rps"] > 0
        assert w["server_cpu_us_per_request"] > 0 and w["client_cpu_us_per_request"] > 0
    assert result["window_get_paced"]["throughput_rps"] < 1.5 * 400  # paced at --rate 400: never faster
    for enc in ("raw", "base64"):
        a = result[f"sketch_audit_{enc}"]
        assert a["audits"] == 2 and a["ranks"] == 2 and 0 < a["p50_ms"] <= a["max_ms"]
    assert result["sketch_audit_raw"]["body_bytes_per_rank"] == 6 * 256 * 4
    assert 0 < result["window_get_inprocess"]["p50_us"] <= result["window_get_inprocess"]["p99_us"]
    assert "GET window, paced" in capsys.readouterr().out
