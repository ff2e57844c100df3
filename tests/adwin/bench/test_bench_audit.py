"""Smoke test of ``adwin bench audit`` on a tiny model and budget."""

from __future__ import annotations

import json
import os

import pytest

from adwin.cli import main


def test_bench_audit_tiny_reports_every_method_against_the_plain_pass(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    rc = main(
        [
            "bench",
            "audit",
            "--tiny",
            "--repeats",
            "2",
            "--isolation",
            "inprocess",
            "--threads",
            "1",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    table = capsys.readouterr().out
    for method in ("plain", "reference", "fast", "sketch"):
        assert method in table
    report = json.loads(out.read_text())
    rows = {r["method"]: r for r in report["rows"]}
    assert set(rows) == {"plain", "reference", "fast", "sketch"}
    assert rows["plain"]["wall_ratio"] == pytest.approx(1.0)
    for r in rows.values():
        assert len(r["wall_s"]) == 2 and r["median_wall_s"] > 0 and r["median_cpu_s"] > 0
        assert r["peak_abs_bytes"] > 0
    # the exact method agrees with the reference; the (small) sketch is close
    assert rows["fast"]["max_abs_dcos_vs_reference"] < 1e-4
    assert rows["sketch"]["max_abs_dcos_vs_reference"] < 0.2
    assert set(rows["fast"]["cosines"]) == {"4", "8", "16"}


def test_bench_audit_measures_each_method_in_its_own_process(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    rc = main(
        [
            "bench",
            "audit",
            "--tiny",
            "--repeats",
            "1",
            "--methods",
            "plain",
            "--threads",
            "1",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["plain"]
    assert rows[0]["pid"] != os.getpid()
    assert rows[0]["peak_bytes"] > 0


def test_bench_audit_rejects_an_unknown_method(capsys) -> None:
    assert main(["bench", "audit", "--tiny", "--methods", "plain,magic"]) == 2
    assert "magic" in capsys.readouterr().err


def test_bench_audit_lora_rows_audit_the_adapters_of_the_same_model(tmp_path) -> None:
    pytest.importorskip("peft")
    out = tmp_path / "bench.json"
    rc = main(["bench", "audit", "--tiny", "--repeats", "1", "--isolation", "inprocess", "--threads", "1",
               "--methods", "plain,fast,lora-plain,lora-fast", "--lora-r", "2", "--warm-runs", "1", "--json", str(out)])
    assert rc == 0
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["lora-plain"]["trainable"] < rows["plain"]["trainable"] == rows["plain"]["params"]
    assert rows["lora-fast"]["trainable"] == rows["lora-plain"]["trainable"]
    assert rows["lora-plain"]["params"] > rows["plain"]["params"]  # the same model plus its adapters
    lora, full = rows["lora-fast"]["cosines"], rows["fast"]["cosines"]
    assert set(lora) == set(full) and all(-1.0 <= v <= 1.0 for v in lora.values())
    assert lora != full  # another parameter space: not the full fine-tuning number
