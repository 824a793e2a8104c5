"""Hostile input beyond damaged files: weights that hold NaN or Inf, float16 that overflows, a config or
a tokenizer that does not fit the tensors, K past the context, and Ctrl-C in the middle of a stream.
Each is one line on stderr, exit code 2 (130 for Ctrl-C), and nothing written half."""

import io
import json
import shutil
import sys

import jax
import numpy as np
import pytest
from conftest import DATA, random_model
from safetensors.numpy import load_file, save_file

import picospec
from picospec import PicospecError
from picospec.tools import cli
from picospec.tools.checkpoints.weights import load_tokenizer, save_checkpoint

PAIR = ["--draft", str(DATA / "tiny-prefixed"), "--target", str(DATA / "tiny-hub")]


def edited_target(tmp_path, edit) -> str:
    """tiny-hub with its tensors passed through edit(dict of arrays)."""
    folder = tmp_path / "target"
    shutil.copytree(DATA / "tiny-hub", folder)
    tensors = {name: array.copy() for name, array in load_file(folder / "model.safetensors").items()}
    edit(tensors)
    save_file(tensors, folder / "model.safetensors")
    return str(folder)


def one_line_exit_2(capsys, *argv) -> str:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and err.startswith("picospec: error: ") and out == "", (out, err)
    return err


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_weights_holding_nan_or_inf_are_found_at_load(capsys, tmp_path, value):
    def spoil(tensors):
        tensors["h.0.mlp.c_fc.weight"].flat[7] = value
    target = edited_target(tmp_path, spoil)
    err = one_line_exit_2(capsys, "--draft", str(DATA / "tiny-prefixed"), "--target", target)
    assert "tensor h.0.mlp.c_fc.weight holds NaN or Inf values" in err
    picospec.load_model(str(DATA / "tiny-hub"))  # the control: the same checkpoint unspoilt loads


def test_weights_too_large_for_float16_are_refused_in_float16(tmp_path):
    def enlarge(tensors):
        tensors["h.1.attn.c_proj.weight"].flat[3] = 1e6  # past float16's 65504
    target = edited_target(tmp_path, enlarge)
    with pytest.raises(PicospecError, match="tensor h.1.attn.c_proj.weight has values too large for float16"):
        picospec.load_model(target, dtype="float16")
    assert np.isfinite(picospec.logits(picospec.load_model(target), [1, 2, 3])).all()  # float32 holds them


def test_a_float16_model_whose_activations_overflow_says_so(capsys, tmp_path):
    """Weights that fit in float16, activations that do not: the MLP's output passes 65504."""
    model = random_model(n_head=2, n_embd=32, vocab_size=40, std=0.5)
    layer = model.params["h"][0]["mlp"]["c_proj"]
    layer["weight"] = layer["weight"] * 2e4  # every weight still below 65504
    save_checkpoint(model, load_tokenizer("tiny-target"), tmp_path, np.float16)
    assert np.abs(np.asarray(layer["weight"])).max() < 65504
    with pytest.raises(PicospecError, match="overflows float16 .* use --dtype bfloat16 or float32"):
        picospec.load_model(str(tmp_path), dtype="float16")
    assert np.isfinite(picospec.logits(picospec.load_model(str(tmp_path)), [1, 2, 3])).all()  # the control


def overflow_past_position_40(tensors):
    """Weights that fit in float16, and pass the load-time probe (positions 0..31): from position 40 on the
    residual stream passes 65504 (60000 from the position embedding, 10000 from the first MLP's bias)."""
    tensors["wpe.weight"][40:, 0] = 6e4
    tensors["h.0.mlp.c_proj.bias"][0] = 1e4


def test_a_float16_model_that_overflows_mid_generation_is_refused_after_the_loop(capsys, tmp_path):
    target = edited_target(tmp_path, overflow_past_position_40)
    run = ["--draft", str(DATA / "tiny-prefixed"), "--target", target, "--prompt", "a b c", "--n-tokens", "50",
           "--temperature", "0", "--json"]
    err = one_line_exit_2(capsys, *run, "--dtype", "float16")
    assert f"{target} (the target) computed NaN or Inf logits with --dtype float16: use --dtype bfloat16" in err
    assert cli.main(run + ["--dtype", "float32"]) == 0  # the control: float32 holds the same weights
    capsys.readouterr()


@pytest.mark.parametrize("temperature", [0.0, pytest.param(0.8, marks=pytest.mark.slow)])  # greedy's one-hot rows too
def test_the_entry_points_name_the_model_that_overflowed(tmp_path, temperature):
    from picospec.beyond import loop
    from picospec.errors import NonFiniteLogits
    draft = picospec.load_model(edited_target(tmp_path, overflow_past_position_40), dtype="float16")
    target = picospec.load_model(str(DATA / "tiny-hub"), dtype="float16")
    key, prompt = jax.random.key(0), [5, 6, 7]
    with pytest.raises(NonFiniteLogits, match="the draft's logits became NaN or Inf") as refused:
        picospec.speculative_sample(draft, target, prompt, 50, key, K=4, temperature=temperature)
    assert refused.value.which == "draft" and refused.value.dtype == "float16"
    _, trace = loop.speculative_sample(draft, target, prompt, 50, key, K=4, temperature=temperature)
    assert trace.finite.tolist() == [False, True] and trace.n_steps > 4  # set mid-generation, not at the start
    _, trace = picospec.speculative_sample(target, target, prompt, 50, key, K=4, temperature=temperature)
    assert trace.finite.tolist() == [True, True]  # the control: a model that holds


def test_a_config_whose_shapes_disagree_with_the_tensors_names_the_tensor(capsys, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(DATA / "tiny-hub", target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | {"n_positions": config["n_positions"] * 2}))
    err = one_line_exit_2(capsys, "--draft", str(DATA / "tiny-prefixed"), "--target", str(target))
    assert "tensor wpe.weight has shape" in err and "config.json implies" in err


def test_a_tokenizer_of_another_vocabulary_is_refused(capsys, tmp_path):
    target = tmp_path / "target"
    shutil.copytree(DATA / "tiny-hub", target)
    shutil.copy(picospec.tools.checkpoints.weights.BUNDLED_DIR / "tiny-target" / "tokenizer.json", target)  # 2048
    err = one_line_exit_2(capsys, "--draft", str(DATA / "tiny-prefixed"), "--target", str(target))
    assert "has 2048 tokens but the model's vocabulary has 300" in err


@pytest.mark.parametrize("mode", ["speculative", "compare"])
def test_K_past_the_context_is_refused_before_anything_is_written(capsys, mode):
    err = one_line_exit_2(capsys, *PAIR, "--prompt", "The", "--K", "100", "--mode", mode)
    assert "+ K=100 exceeds the model's context of 64" in err and "prompt 1 of 1" not in err


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def interrupted_after_one_iteration(monkeypatch):
    real = cli.stream

    def stream(*args, **kwargs):
        iterations = real(*args, **kwargs)
        yield next(iterations)
        raise KeyboardInterrupt  # as Ctrl-C would, between two iterations
    monkeypatch.setattr(cli, "stream", stream)


def test_ctrl_c_ends_the_stream_with_the_colour_reset(monkeypatch):
    interrupted_after_one_iteration(monkeypatch)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr(sys, "stdout", terminal := FakeTerminal())
    assert cli.main([*PAIR, "--prompt", "The quick", "--n-tokens", "20"]) == 130
    text = terminal.getvalue()
    assert "\033[" in text and text.endswith("\033[0m\n")  # coloured, and left uncoloured


def test_ctrl_c_leaves_json_lines_whole(capsys, monkeypatch, tmp_path):
    real = cli.print_row
    rows = []

    def print_row(*args):  # the interrupt comes after the first finished row
        real(*args)
        rows.append(1)
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "print_row", print_row)
    code = cli.main([*PAIR, "--prompt", "The", "--prompt", "All that", "--n-tokens", "6", "--json"])
    out, _ = capsys.readouterr()
    assert code == 130 and rows == [1]
    lines = out.split("\n")
    assert lines[-1] == "" and len(lines) == 2 and json.loads(lines[0])["tokens"]  # one whole line, then nothing
