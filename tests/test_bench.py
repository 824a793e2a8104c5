"""The benchmark runs end to end on tiny models (it asserts no timing: benchmarks are not tests)."""

import functools
import json
import time
from pathlib import Path

import bench
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import DATA, DEVICE, random_model
from timing import forward_times, iteration_calls, race_laps

from picospec.beyond import theory
from picospec.gpt2 import forward, init_cache

PAIR = f"{DATA / 'tiny-prefixed'}:{DATA / 'tiny-hub'}"


@pytest.mark.slow  # the fast suite's time: the full variant below runs every part, with -m slow
def test_benchmark_runs_on_tiny_models_and_writes_its_report(tmp_path, capsys, monkeypatch):
    """One dtype, no start-up or batch rows, one short timed round each: the slow variant below runs
    every part with the real rounds."""
    monkeypatch.setattr(bench, "forward_times", functools.partial(forward_times, min_seconds=0.02, rounds=1))
    monkeypatch.setattr(bench, "race", functools.partial(bench.race, rounds=1))
    monkeypatch.setattr(bench, "STREAM_CALLS", 2)  # the bandwidth probe's loop, shortened
    out = tmp_path / "bench.json"
    bench.main(["--decode", str(DATA / "tiny-hub"), "--pairs", PAIR, "--K", "2", "--v-K", "1", "--n-tokens", "12",
                "--no-transformers", "--startup", "", "--dtype", "float32", "--out", str(out), "--batch", ""])
    report = json.loads(out.read_text())
    [decode], [pair_report] = report["decode"], report["pairs"]
    # One short round cannot time a tiny model's step to the sign (the slow variant does): it ran.
    assert decode["picospec_compile_seconds"] > 0 and decode["transformers_ms_per_token"] is None
    assert set(pair_report["v"]) == {"1", "2"} and pair_report["c"] > 0
    [row] = pair_report["rows"]
    assert row["tokens_per_call"] >= 1 and row["predicted_speedup"] > 0 and 0 <= row["alpha"] <= 1
    assert report["device"] == DEVICE and decode["bandwidth_GBps"] > 0
    table = capsys.readouterr().out
    assert "| K | alpha |" in table and f"on {DEVICE}; transformers on" in table  # the device, in every table


@pytest.mark.slow
def test_every_part_of_the_benchmark_runs_on_tiny_models(tmp_path, capsys):
    out = tmp_path / "bench.json"
    pair = PAIR
    bench.main(["--decode", str(DATA / "tiny-hub"), "--pairs", pair, "--K", "2", "--v-K", "1",
                "--n-tokens", "12", "--no-transformers", "--startup", pair, "--dtype", "float32,bfloat16", "--out", str(out),
                "--batch", "2", "--batch-pairs", pair])
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
            assert row["calls_cost"] > 0 and row["predicted_speedup_alternating"] > 0
    [batch] = report["batch"]
    assert [r["B"] for r in batch["rows"]] == [2]
    for row in batch["rows"]:
        assert row["ar_tokens_per_second"] > 0 and row["spec_tokens_per_second"] > 0 and row["v"] > 0
        assert "transformers_tokens_per_second" not in row  # --no-transformers
    [startup] = report["startup"]
    assert startup["cold_seconds"] > 0 and startup["warm_seconds"] > 0  # a fresh process reached a token
    table = capsys.readouterr().out
    assert "| model | dtype | weights | picospec ms/token" in table and "| K | alpha |" in table
    assert "| B | autoregressive tok/s |" in table
    assert "—x" not in table  # a missing number is a dash, not a dash with a unit


def test_real_gpt2_prediction_gives_back_jaymodys_speedup_at_his_costs():
    K, c = bench.JAYMODY["K"], bench.JAYMODY["c"]
    pair = {"c": c, "v": {K: 1.0, 8: 2.0}, "rows": [{"K": K, "iteration_cost": 2.0}]}
    prediction = bench.real_gpt2_prediction(pair)
    assert prediction["theory_by_K"][K] == pytest.approx(60.64 / 27.15)  # his costs: his speedup
    assert 0.70 < prediction["alpha"] < 0.75
    [row] = prediction["rows"]  # with an iteration that costs two autoregressive steps, half his tokens/s
    assert row["from_iteration_cost"] == pytest.approx(row["tokens_per_call"] / 2.0)
    assert prediction["theory_by_K"][8] < prediction["theory_by_K"][K]  # a costly v(8) shows


def test_the_timed_iteration_makes_K_draft_calls_then_one_target_call_and_rolls_both_back():
    draft, target, K = random_model(seed=1, vocab_size=16), random_model(seed=2, vocab_size=16), 3

    def prefilled(m):  # 5 positions cached (forward donates its cache: a fresh one each time)
        return forward(m, jnp.arange(5) % 16, init_cache(m.config, 32))[1]

    def by_hand(token):  # one iteration, written out: greedy drafts, then the target over all of them
        cache, block = prefilled(draft), [token]
        for _ in range(K):
            logits, cache = forward(draft, jnp.array([block[-1]]), cache)
            block.append(int(jnp.argmax(logits[-1])))
        logits, _ = forward(target, jnp.array(block), prefilled(target))
        return int(jnp.argmax(logits[-1]))

    # Rolled back, every iteration starts from the same caches: n iterations chain n hand-made ones.
    got = iteration_calls(draft, target, K, jnp.int32(2), prefilled(draft), prefilled(target))
    np.testing.assert_array_equal(got, [by_hand(by_hand(0))])


def test_forward_times_races_the_runs_it_predicts_in_the_same_rounds():
    model, calls_made = random_model(seed=3, vocab_size=16), []

    def run():  # a stand-in for a sampler run: 10 ms, counted
        calls_made.append(1)
        time.sleep(0.01)
    t = forward_times({"one token": (model, 1), "five tokens": (model, 5)}, capacity=32,
                      others={"run": run}, min_seconds=0.001, rounds=3)
    assert set(t) == {"one token", "five tokens", "run"}
    assert len(calls_made) == 1 + 3  # the warm-up call, then one call each round
    assert t["run"] >= 0.01  # a whole call of `run`, not divided like a forward call's loop
    assert t["one token"] > 0 and t["five tokens"] > 0


def test_a_race_takes_its_contenders_in_the_reverse_order_every_other_round():
    """A place in the round tells on a time, so no contender may always go first (or last)."""
    called = []
    a, b, c = (lambda: called.append("a")), (lambda: called.append("b")), (lambda: called.append("c"))
    laps, warmup = race_laps(4, a=a, b=b, c=c)
    assert "".join(called) == "abc" + "abc" + "cba" + "abc" + "cba"  # the warm-up, then rounds 0-3
    assert len(laps) == 4 and all(set(lap) == {"a", "b", "c"} for lap in laps) and set(warmup) == {"a", "b", "c"}
    called.clear()
    race_laps(1, warm=False, first=1, a=a, b=b)
    assert called == ["b", "a"]  # round 1 of a race run one round a call


@pytest.mark.slow  # about 4 minutes on 2 cores: --K auto times its iterations first, the CLI runs twice
def test_the_gpu_benchmark_runs_on_the_cpu_and_writes_every_figure(tmp_path, capsys):
    """benchmarks/gpu.py --cpu: the GPU's command with small settings. Its figures are sane: compile
    times are positive, every contender made tokens, an iteration costs at least a fraction of its
    floor, v(K) and c are positive, the target's time at its full depth (the deeper of the two timed
    here) is the one extrapolated, theory's speedup is what walltime_improvement gives from them, and
    the CLI and the library both made tokens; no part was skipped."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu", Path(__file__).parents[1] / "benchmarks" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    gpu.main(["--cpu", "--json", str(tmp_path / "gpu.json")])
    report = json.loads((tmp_path / "gpu.json").read_text())
    assert report["compile"]["cli_compile_s"] > 0 and report["compile"]["sampler_compile_s"] > 0
    assert [(r["B"], r["T"]) for r in report["bundled"]] == [(1, 0.0), (1, 0.8)] and not report["skipped"]
    for row in report["bundled"]:
        assert set(row["tokens_per_s"]) == {"autoregressive", "K=2", "auto", "head K=2"}  # the head: B = 1
        assert min(row["tokens_per_s"].values()) > 0
        assert row["iteration"]["2"]["over_floor"] > 0.3 and 0 <= row["auto_k"] <= 7
    assert [r["dtype"] for r in report["gpt2"]] == ["float32", "bfloat16"]
    for row in report["gpt2"]:
        assert row["c"] > 0 and set(row["v"]) == {"1", "2"} and min(row["v"].values()) > 0
        K, speedup = row["theory"]["0.8"]["K"], row["theory"]["0.8"]["speedup"]
        assert speedup == pytest.approx(float(theory.walltime_improvement(0.8, K, row["c"], row["v"][str(K)])))
        assert row["target_ms_per_token"] == pytest.approx(row["target_ms_per_token_measured"])  # depth 4 of 4
    assert set(report["cli"]) == {"autoregressive", "speculative"}
    assert all(r["cli"] > 0 and r["library"] > 0 for r in report["cli"].values())
    assert report["greedy"] == dict(dtype="float32", rows=2, identical_rows=2, first_difference=[])
    assert "| float32 |" in capsys.readouterr().out


@pytest.mark.slow  # about a minute: two drafts compiled at two K, and two CLI processes
def test_the_eagle_benchmark_measures_both_drafts_from_the_same_runs(tmp_path, capsys):
    """benchmarks/eagle.py, small: alpha by position has K entries in [0, 1], tokens per call lies in
    [1, K + 1], the launch-bound prediction is theory's from the alpha and kernel counts it reports, and
    the head's step launches fewer kernels than the four-layer draft's."""
    import eagle
    eagle.main(["--prompts", "2", "--n-tokens", "16", "--rounds", "1", "--ks", "2,4", "--temperatures", "0",
                "--no-auto", "--cli-rounds", "1", "--out", str(tmp_path / "eagle.json")])
    report = json.loads((tmp_path / "eagle.json").read_text())
    assert report["kernels"]["tiny-head"] < report["kernels"]["tiny-draft"] < report["kernels"]["target"]
    for row in report["rows"]:
        K = row["K"]
        assert len(row["alpha_by_position"]) == K and all(0 <= a <= 1 for a in row["alpha_by_position"])
        assert 1 <= row["tokens_per_call"] <= K + 1 and row["tokens_per_second"] > 0
        c = report["kernels"][row["draft"]] / report["target_call_kernels"][str(K)]
        assert row["gpu_theory"] == pytest.approx(float(theory.walltime_improvement(row["alpha"], K, c)))
    assert {r["draft"] for r in report["cli"]} == {"tiny-draft", "tiny-head"}
    assert "| 0 | tiny-head | 4 |" in capsys.readouterr().out


@pytest.mark.slow  # a dozen CLI processes, --K auto's costs timed first
def test_the_held_out_race_reports_on_the_half_it_was_not_tuned_on(tmp_path, capsys):
    """benchmarks/held_out.py: the report half's prompts come from the second half of the held-out file
    only, and one short round through the CLI gives every contender's figures and the noise floor (B = 1: over
    --singles prompts, each its own process)."""
    import held_out

    from picospec.tools.checkpoints.weights import BUNDLED_DIR
    lines = (BUNDLED_DIR / "heldout_sample.txt").read_text().splitlines()
    half = len(lines) // 2
    for name, mine in (("tune", lines[:half]), ("report", lines[half:])):
        assert all(any(line.startswith(p) for line in mine) for p in held_out.prompts(name, 0, half))
    held_out.main(["--batches", "1,2", "--temperatures", "0", "--rounds", "1", "--n-tokens", "4", "--ks", "2,4",
                   "--singles", "2", "--json", str(tmp_path / "race.json")])
    one, two = json.loads((tmp_path / "race.json").read_text())
    for row in (one, two):
        assert set(row["ratio"]) == {"autoregressive", "autoregressive again", "auto", "K = 2", "K = 4"}
        assert row["ratio"]["autoregressive"] == 1.0 and row["best"].startswith("K =") and row["floor"] > 0
    assert len(one["decided"]) == 2 and len(two["decided"]) == 1  # auto's decisions, each run: two prompts, one batch
    out = capsys.readouterr().out
    assert "| 1 | 0 |" in out and "| 2 | 0 |" in out
