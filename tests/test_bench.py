"""The benchmark runs end to end on tiny models (it asserts no timing: benchmarks are not tests)."""

import json

from conftest import DATA

from picospec import bench


def test_benchmark_runs_on_tiny_models_and_writes_its_report(tmp_path, capsys):
    out = tmp_path / "bench.json"
    pair = f"{DATA / 'tiny-prefixed'}:{DATA / 'tiny-hub'}"
    bench.main(["--decode", str(DATA / "tiny-hub"), "--pairs", pair, "--K", "2", "--v-K", "1",
                "--n-tokens", "12", "--no-transformers", "--dtype", "float32,bfloat16", "--out", str(out)])
    report = json.loads(out.read_text())
    assert [d["dtype"] for d in report["decode"]] == ["float32", "bfloat16"]
    for decode in report["decode"]:
        assert decode["picospec_ms_per_token"] > 0 and decode["transformers_ms_per_token"] is None
        assert 0 < decode["roofline_fraction"] and decode["bandwidth_GBps"] > 0
        assert decode["picospec_compile_seconds"] > 0  # the warm-up call compiles; reported apart
    assert [p["dtype"] for p in report["pairs"]] == ["float32", "bfloat16"]
    for pair_report in report["pairs"]:
        assert [r["K"] for r in pair_report["rows"]] == [2]
        assert set(pair_report["v"]) == {"1", "2"}  # K values for rows and for v(K), as JSON keys
        assert all(v > 0 for v in pair_report["v"].values()) and pair_report["c"] > 0
        for row in pair_report["rows"]:
            assert row["tokens_per_call"] >= 1 and row["predicted_speedup"] > 0 and 0 <= row["alpha"] <= 1
    table = capsys.readouterr().out
    assert "| model | dtype | weights | picospec ms/token" in table and "| K | alpha |" in table
    assert "—x" not in table  # a missing number is a dash, not a dash with a unit
