"""`python -m picospec`: good runs in every mode, colours, and a one-line error for each bad input."""

import io
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import DATA, DEVICE

from picospec.tools import cli
from picospec.tools.autotune import laps
from picospec.tools.cli import options
from picospec.tools.cli.picture import DPI, figure_size
from picospec.tools.cli.show import show
from picospec.tools.cli.steps import Step

PAIR = ["--draft", str(DATA / "tiny-prefixed"), "--target", str(DATA / "tiny-hub")]


def run_cli(capsys, *argv):
    code = cli.main([*argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("mode", ["speculative", "autoregressive"])
def test_json_run_adds_up(capsys, mode):
    code, out, _ = run_cli(capsys, *PAIR, "--prompt", "The quick", "--n-tokens", "12", "--K", "3",
                           "--temperature", "0.8", "--mode", mode, "--json")
    assert code == 0
    result = json.loads(out)
    assert set(result) == {"text", "tokens", "prompt_tokens", "steps", "stats"}
    stats = result["stats"]
    assert len(result["tokens"]) == stats["n_tokens"] == 12
    assert stats["n_steps"] == len(result["steps"])
    assert sum(len(s["tokens"]) for s in result["steps"]) == 12
    assert stats["tokens_per_step"] == pytest.approx(12 / stats["n_steps"])
    assert stats["compile_seconds"] > 0 and stats["seconds"] > 0
    assert stats["tokens_per_second"] == pytest.approx(12 / stats["seconds"])
    if mode == "speculative":
        accepted = sum(s["accepted"] for s in result["steps"])
        assert stats["acceptance_rate"] == pytest.approx(accepted / (3 * stats["n_steps"]))
        for s in result["steps"]:  # every step: accepted drafts, then one resample or bonus
            assert s["tokens"] == (s["drafted"][:s["accepted"]] + s["tokens"][-1:])[:len(s["tokens"])]
            assert s["bonus"] == (s["accepted"] == 3)
    else:
        assert stats["n_steps"] == 12 and stats["acceptance_rate"] is None


@pytest.mark.parametrize("flags", [pytest.param(["--K", "auto", "--confidence", "0.3"], marks=pytest.mark.slow),
                                   pytest.param(["--K", "3", "--drafts", "2"], marks=pytest.mark.slow)])  # fast:
# test_cli_record.py checks the same of its auto run (adds_up)
def test_json_reports_the_rule_the_drafts_and_the_K_used(capsys, tmp_path, monkeypatch, flags):
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", str(tmp_path / "jit"))  # costs.json goes in it
    monkeypatch.setattr(options, "AUTO_K_MAX", 3)  # auto's K_max (7 in use): less to compile here
    asked = []
    timed = lambda *args: asked.append(args) or {"v": [2.0, 1.0, 1.2, 1.4], "prefill": 0.5, "spread": 0.0,  # noqa: E731
                                                  "ms": 1.0, "rounds": 0}  # timed: test_autotune.py
    monkeypatch.setattr(laps, "costs", timed)
    code, out, _ = run_cli(capsys, *PAIR, "--prompt", "The quick", "--n-tokens", "12", "--temperature", "0.8",
                           "--verify", "match", "--json", *flags)
    assert code == 0
    result = json.loads(out)
    stats, steps = result["stats"], result["steps"]
    assert stats["verify"] == "match" and stats["K"] == (3 if "3" in flags else "auto")
    assert stats["drafts"] == (2 if "--drafts" in flags else 1)
    adds_up(stats, steps)
    assert all(s["k"] <= 3 for s in steps)
    if "auto" in flags:
        kept = json.loads((tmp_path / "jit" / "costs.json").read_text())
        (measured,) = kept.values()
        assert measured["v"] == [2.0, 1.0, 1.2, 1.4] and len(asked) == 1  # kept beside the compile cache


def adds_up(stats, steps):
    """A row's JSON report agrees with its steps: k drafted a call, accepted ones first, the bonus after
    all k, and the summary's K used and acceptance."""
    assert stats["K_used"] == pytest.approx(np.mean([s["k"] for s in steps]))
    assert stats["acceptance_rate"] == pytest.approx(sum(s["accepted"] for s in steps) / sum(s["k"] for s in steps))
    for s in steps:  # the drafts each call proposed: k of them, accepted ones first
        assert len(s["drafted"]) == s["k"] and s["accepted"] <= s["k"]
        assert s["bonus"] == (s["accepted"] == s["k"])


def test_compare_mode_greedy_is_identical_and_reports_speedup(capsys):
    code, out, _ = run_cli(capsys, *PAIR, "--prompt", "To be", "--n-tokens", "15", "--mode", "compare", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["identical"] is True
    assert result["autoregressive"]["tokens"] == result["speculative"]["tokens"]
    ar, spec = result["autoregressive"]["stats"], result["speculative"]["stats"]
    assert result["speedup"] == pytest.approx(spec["tokens_per_second"] / ar["tokens_per_second"])


def test_streamed_text_and_summary(capsys):
    code, out, err = run_cli(capsys, *PAIR, "--prompt", "All that", "--n-tokens", "8", "--mode", "compare")
    assert code == 0
    assert out.count("All that") == 2 and "--- speculative ---" in out
    assert "\033[" not in out  # not a terminal: no colour
    assert "[speculative] 8 tokens" in err and "target calls" in err and "compile" in err
    assert err.count(f"; {DEVICE}\n") == 2  # each summary line names the device
    assert "greedy outputs identical" in err


def test_empty_prompt_starts_from_endoftext(capsys):
    code, out, _ = run_cli(capsys, *PAIR, "--n-tokens", "3", "--json")
    assert code == 0 and json.loads(out)["prompt_tokens"] == [0]


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_colours_on_a_terminal_and_no_color(monkeypatch):
    tokenizer = cli.load_tokenizer(str(DATA / "tiny-hub"))
    step = Step(tokens=[40, 41, 42], drafted=[40, 41, 50], accepted=2)
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = FakeTerminal()
    show(out, tokenizer, [], step, "speculative", "")
    text = out.getvalue()
    assert "\033[32m" in text and "\033[33m" in text and "\033[9;31m" in text  # accepted, resample, rejected
    monkeypatch.setenv("NO_COLOR", "1")
    out = FakeTerminal()
    show(out, tokenizer, [], step, "speculative", "")
    assert out.getvalue() == tokenizer.decode([40, 41, 42])
    out = FakeTerminal()  # autoregressive decoding's steps (tokens alone), shown plain on a terminal too
    monkeypatch.delenv("NO_COLOR")
    show(out, tokenizer, [], Step(tokens=[40]), "autoregressive", "")
    assert out.getvalue() == tokenizer.decode([40])


def bad_checkpoint(tmp_path, kind):
    folder = tmp_path / kind
    shutil.copytree(DATA / "tiny-hub", folder)
    weights = folder / "model.safetensors"
    if kind == "truncated":
        weights.write_bytes(weights.read_bytes()[:5000])
    elif kind == "corrupt":
        weights.write_bytes(b"\xff" * 64)
    elif kind == "pickle":
        weights.unlink()
        (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not unpickled")
    elif kind == "vocab":
        from conftest import random_model

        from picospec.tools.checkpoints.weights import load_tokenizer, save_checkpoint
        save_checkpoint(random_model(vocab_size=301, n_positions=64), load_tokenizer(str(folder)), folder)
    return str(folder)


BAD = {
    "unknown model": (["--target", "gpt-17"], "not a known model"),
    "missing folder": (["--target", "./nowhere/model"], "no folder './nowhere/model'"),
    "K < 1": ([*PAIR, "--K", "0"], "K must be >= 1"),
    "temperature < 0": ([*PAIR, "--temperature", "-1"], "temperature must be >= 0"),
    "top-p 0": ([*PAIR, "--top-p", "0"], "top-p must be in (0, 1]"),
    "top-p > 1": ([*PAIR, "--top-p", "1.2"], "top-p must be in (0, 1]"),
    "top-k < 0": ([*PAIR, "--top-k", "-3"], "top-k must be a whole number >= 0"),
    "n-tokens < 1": ([*PAIR, "--n-tokens", "0"], "n-tokens must be >= 1"),
    "beyond context": ([*PAIR, "--n-tokens", "60", "--prompt", "The quick brown"], "exceeds the model's context of 64"),
    "unknown dtype": ([*PAIR, "--dtype", "float8"], "unknown dtype 'float8'"),
    "not a number": ([*PAIR, "--K", "four"], "argument --K: give a whole number or auto, not 'four'"),
    "confidence of 1": ([*PAIR, "--confidence", "1"], "confidence must be in [0, 1), got 1.0"),
    "block with drafts": ([*PAIR, "--verify", "block", "--drafts", "2"], "several drafts need a draft model"),
    "unknown mode": ([*PAIR, "--mode", "fast"], "argument --mode: invalid choice: 'fast'"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_exit_2(capsys, case):
    argv, message = BAD[case]
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("picospec: error: ") and message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("kind, message", [
    ("truncated", "is not a valid safetensors file"), ("corrupt", "is not a valid safetensors file"),
    ("pickle", "only pytorch_model.bin, a pickle"), ("vocab", "the draft's vocabulary (301 tokens) differs"),
])
def test_bad_checkpoints_are_one_line_exit_2(capsys, tmp_path, kind, message):
    bad = bad_checkpoint(tmp_path, kind)
    argv = ["--draft", bad, "--target", str(DATA / "tiny-hub")] if kind == "vocab" else \
        ["--draft", str(DATA / "tiny-hub"), "--target", bad]
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and message in err, err


def test_cheap_problems_are_reported_before_any_weights_load(capsys, tmp_path):
    # The target's weights are damaged too: an error about them would mean they were read first
    # (gpt2-xl's take tens of seconds to load before such a message).
    target = Path(bad_checkpoint(tmp_path, "corrupt"))
    (target / "tokenizer.json").unlink()
    code, _, err = run_cli(capsys, "--draft", str(DATA / "tiny-hub"), "--target", str(target))
    assert code == 2 and "tokenizer.json is missing" in err, err
    damaged = bad_checkpoint(tmp_path / "2", "corrupt")
    code, _, err = run_cli(capsys, "--draft", "./nowhere/draft", "--target", damaged)
    assert code == 2 and "no folder './nowhere/draft'" in err, err


def test_no_network_says_to_go_offline_or_use_a_folder(tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "picospec", "--prompt", "Hi"], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0
    assert "HF_HUB_OFFLINE" in out.stderr and "local folder" in out.stderr


def test_a_reader_that_stops_reading_ends_the_command_quietly():
    """`picospec ... | head`: the pipe closed before the first streamed token is written."""
    run = subprocess.Popen([sys.executable, "-m", "picospec", *PAIR, "--prompt", "And God said"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run.stdout.close()
    err = run.stderr.read()
    assert run.wait() == 141 and "Traceback" not in err and "Broken pipe" not in err, err


def test_ngram_draft_run_counts_only_proposing_steps(capsys):
    code, out, _ = run_cli(capsys, "--draft", "ngram", "--ngram-max", "2", "--target", str(DATA / "tiny-hub"),
                           "--prompt", "the cat the cat the cat the cat", "--n-tokens", "20", "--K", "4", "--json")
    assert code == 0
    result = json.loads(out)
    steps, stats = result["steps"], result["stats"]
    proposing = [s for s in steps if s["proposed"]]
    assert proposing and sum(len(s["tokens"]) for s in steps) == 20
    assert stats["acceptance_rate"] == pytest.approx(sum(s["accepted"] for s in steps) / (4 * len(proposing)))
    assert all(s["accepted"] == 0 and s["drafted"] == [] for s in steps if not s["proposed"])


def test_ngram_max_below_one_is_refused(capsys):
    code, _, err = run_cli(capsys, "--draft", "ngram", "--ngram-max", "0", "--target", str(DATA / "tiny-hub"))
    assert code == 2 and "max n must be a whole number >= 1" in err and err.count("\n") == 1


def test_bundled_pair_offline_from_the_readme(capsys):
    code, out, err = run_cli(capsys, "--draft", "tiny-draft", "--target", "tiny-target", "--prompt", "And God said",
                             "--n-tokens", "30", "--mode", "compare", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["identical"] is True  # greedy: speculative equals the target alone
    stats = result["speculative"]["stats"]
    assert stats["acceptance_rate"] > 0.3 and stats["tokens_per_step"] > 1.5  # a real, learned pair
    assert result["speculative"]["text"].split()[0] == "unto"


# ---- several prompts: one batch ----

@pytest.mark.slow  # the batch path's rows are checked fast in test_batch.py and test_keys.py
def test_several_prompts_run_as_one_batch_and_each_row_is_its_single_run(capsys, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The quick\n\nTo be or not to be, that is\n")  # the blank line is skipped
    code, out, _ = run_cli(capsys, *PAIR, "--prompt", "All that", "--prompt-file", str(prompts), "--n-tokens", "10",
                           "--temperature", "0", "--mode", "compare", "--json")
    assert code == 0
    lines = [json.loads(line) for line in out.splitlines()]
    rows, summary = lines[:-1], lines[-1]["summary"]
    assert sorted((r["mode"], r["row"]) for r in rows) == [(m, b) for m in ("autoregressive", "speculative")
                                                           for b in range(3)]
    assert summary["identical"] is True and summary["speculative"]["n_prompts"] == 3
    assert summary["speculative"]["n_tokens"] == 30 and summary["speculative"]["acceptance_rate"] is not None
    for row in rows:  # greedy: every row is what the one-prompt command prints for that prompt
        if row["mode"] == "speculative":
            _, single, _ = run_cli(capsys, *PAIR, "--prompt", row["prompt"], "--n-tokens", "10", "--temperature", "0",
                                   "--json")
            assert row["tokens"] == json.loads(single)["tokens"]
            assert row["stats"]["n_steps"] == json.loads(single)["stats"]["n_steps"]


def test_prompts_from_stdin_print_each_row_and_a_summary(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("The quick\nAll that\n"))
    code, out, err = run_cli(capsys, *PAIR, "--prompt-file", "-", "--n-tokens", "6", "--temperature", "0.8")
    assert code == 0
    assert "--- speculative, prompt 1 of 2 ---\nThe quick" in out
    assert "--- speculative, prompt 2 of 2 ---\nAll that" in out
    assert "[speculative] prompt 1: 6 tokens" in err and "[speculative] batch of 2: 12 tokens" in err


BAD_BATCHES = {
    "empty prompt file": ("", "the prompt file {file} has no prompts"),
    "blank prompt file": ("\n  \n", "the prompt file {file} has no prompts"),
    "a line past the context": ("The quick\n" + "word " * 70 + "\n", "prompt 2 of 2: prompt ("),
    "not UTF-8": (b"\xff\xfe bad", "cannot read the prompt file {file}"),
}


@pytest.mark.parametrize("case", BAD_BATCHES)
def test_bad_prompt_files_are_one_line_exit_2(capsys, tmp_path, case):
    content, message = BAD_BATCHES[case]
    file = tmp_path / "prompts.txt"
    file.write_bytes(content if isinstance(content, bytes) else content.encode())
    code, _, err = run_cli(capsys, *PAIR, "--prompt-file", str(file), "--n-tokens", "10")
    assert code == 2 and err.count("\n") == 1 and message.format(file=file) in err, err


def test_a_missing_prompt_file_is_one_line_exit_2(capsys, tmp_path):
    code, _, err = run_cli(capsys, *PAIR, "--prompt-file", str(tmp_path / "nope.txt"))
    assert code == 2 and err.count("\n") == 1 and "cannot read the prompt file" in err and "No such file" in err


def test_a_batch_too_large_for_memory_is_refused_before_allocating(capsys, tmp_path, monkeypatch):
    from picospec.tools import memory
    monkeypatch.setattr(memory, "available_memory", lambda device=None: 10 ** 6)  # as if 1 MB were free
    file = tmp_path / "prompts.txt"
    file.write_text("The quick\n" * 200)
    code, _, err = run_cli(capsys, *PAIR, "--prompt-file", str(file), "--n-tokens", "10")
    assert code == 2 and err.count("\n") == 1 and "200 prompts need about" in err and "give at most" in err, err


def test_the_device_is_named_in_the_summary_and_the_json(capsys):
    if not here("cpu"):
        pytest.skip("JAX_PLATFORMS leaves the CPU out")
    code, out, _ = run_cli(capsys, *PAIR, "--prompt", "The", "--n-tokens", "4", "--platform", "cpu", "--json")
    assert code == 0 and json.loads(out)["stats"]["device"] == {"platform": "cpu", "kind": "cpu", "name": "cpu:0"}
    assert json.loads(out)["stats"]["dtype"] == "float32"  # the CPU's dtype, as none was asked for
    # The summary line's device is checked in test_streamed_text_and_summary.


def here(platform: str) -> bool:
    try:
        return bool(jax.devices(platform))
    except RuntimeError:
        return False


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_a_platform_that_is_not_here_is_one_line_exit_2(capsys, platform):
    if here(platform):
        pytest.skip(f"this machine has a {platform}")
    code, _, err = run_cli(capsys, *PAIR, "--prompt", "The", "--platform", platform)
    assert code == 2 and err.count("\n") == 1 and f"no {platform} here" in err and "--platform" in err, err


def test_plot_writes_the_grid_of_every_iteration(capsys, tmp_path):
    path = tmp_path / "grid.png"
    code, out, _ = run_cli(capsys, *PAIR, "--prompt", "The quick", "--n-tokens", "12", "--K", "3", "--temperature",
                           "0.8", "--json", "--plot", str(path))
    assert code == 0
    png = path.read_bytes()
    width, height = struct.unpack(">II", png[16:24])  # the PNG header's size
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert (width, height) == tuple(round(x * DPI) for x in figure_size(json.loads(out)["stats"]["n_steps"], 3))


def test_plot_without_matplotlib_or_for_autoregressive_is_one_line_exit_2(capsys, monkeypatch, tmp_path):
    code, _, err = run_cli(capsys, *PAIR, "--mode", "autoregressive", "--plot", str(tmp_path / "a.png"))
    assert code == 2 and err.count("\n") == 1 and "--plot draws the speculative run" in err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the plot extra were not installed
    code, _, err = run_cli(capsys, *PAIR, "--plot", str(tmp_path / "a.png"))
    assert code == 2 and err.count("\n") == 1 and '--plot needs matplotlib: pip install -e ".[plot]"' in err, err
    assert not (tmp_path / "a.png").exists()


def test_verify_block_reports_its_rule_and_weights_and_a_bad_rule_is_one_line(capsys):
    code, out, _ = run_cli(capsys, *PAIR, "--prompt", "The quick", "--n-tokens", "8", "--K", "3", "--temperature",
                           "0.8", "--verify", "block", "--json")
    record = json.loads(out)
    assert code == 0 and record["stats"]["verify"] == "block" and record["stats"]["K"] == 3
    assert record["stats"]["drafts"] == 1 and all(len(s["w"]) == len(s["h"]) == 3 for s in record["steps"])
    code, _, err = run_cli(capsys, *PAIR, "--prompt", "The", "--verify", "blocks")
    assert code == 2 and err.count("\n") == 1 and "invalid choice: 'blocks'" in err

