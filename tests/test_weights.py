"""Finding and loading checkpoints: names, the hub cache, layouts, and every loader error."""

import json
import os
import shutil
import subprocess
import sys

import huggingface_hub
import jax
import numpy as np
import pytest
from conftest import DATA
from load_memory import peak_ratio
from safetensors.numpy import load_file, save_file

import picospec
from picospec import PicospecError
from picospec.gpt2 import GPT2Config, init_params
from picospec.tools.checkpoints import weights
from picospec.tools.checkpoints.config import config_json
from picospec.tools.checkpoints.tensors import checkpoint_tensors, expected

SOURCE = DATA / "tiny-hub"


def copy_checkpoint(tmp_path, edit=None):
    """A copy of tiny-hub whose tensors `edit(dict)` may change."""
    folder = tmp_path / "ckpt"
    shutil.copytree(SOURCE, folder)
    if edit:
        tensors = load_file(folder / "model.safetensors")
        edit(tensors)
        save_file(tensors, folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("config", [GPT2Config(n_layer=2, n_head=2, n_embd=16, n_positions=64, vocab_size=8),
                                    GPT2Config(n_layer=48, n_head=25, n_embd=1600)])  # and GPT-2 1558M's
def test_the_tree_a_checkpoint_must_hold_is_the_one_init_params_makes(config):
    made = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    want = expected(config)
    assert jax.tree.structure(want) == jax.tree.structure(made)
    assert [(x.shape, x.dtype) for x in jax.tree.leaves(want)] == [(x.shape, x.dtype) for x in jax.tree.leaves(made)]


def test_both_key_layouts_load_to_the_same_tree_and_skip_mask_buffers():
    hub = picospec.load_model(str(DATA / "tiny-hub"))
    prefixed = picospec.load_model(str(DATA / "tiny-prefixed"))
    assert hub.config.n_head == 3 and prefixed.config.n_head == 4
    assert sorted(hub.params) == sorted(prefixed.params) == ["h", "ln_f", "wpe", "wte"]
    assert sorted(hub.params["h"][1]["attn"]) == ["c_attn", "c_proj"]  # no bias/masked_bias
    stored = load_file(SOURCE / "model.safetensors")["h.1.attn.c_attn.weight"]
    np.testing.assert_array_equal(hub.params["h"][1]["attn"]["c_attn"]["weight"], stored.T)  # Conv1D, transposed


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.pop("h.1.mlp.c_fc.bias"), "missing tensor h.1.mlp.c_fc.bias"),
    (lambda t: t.update({"h.0.mlp.extra": np.zeros(3, np.float32)}), "unexpected tensor h.0.mlp.extra"),
    (lambda t: t.update({"wpe.weight": t["wpe.weight"][:10]}), "tensor wpe.weight has shape (10, 24)"),
])
def test_bad_tensors_are_named(tmp_path, edit, message):
    folder = copy_checkpoint(tmp_path, edit)
    with pytest.raises(PicospecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        picospec.load_model(str(folder))


def test_truncated_file_is_reported(tmp_path):
    folder = copy_checkpoint(tmp_path)
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(PicospecError, match="model.safetensors is not a valid safetensors file .* download it again"):
        picospec.load_model(str(folder))


@pytest.mark.parametrize("content", [b"", b"\x05", b"garbage!" * 10, (20).to_bytes(8, "little") + b"{not json" * 3])
def test_corrupt_header_is_reported(tmp_path, content):
    folder = copy_checkpoint(tmp_path)
    (folder / "model.safetensors").write_bytes(content)
    with pytest.raises(PicospecError, match="model.safetensors is not a valid safetensors file"):
        picospec.load_model(str(folder))


def test_pickle_only_checkpoint_is_refused_without_unpickling(tmp_path):
    folder = copy_checkpoint(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not to be unpickled")
    with pytest.raises(PicospecError, match="only pytorch_model.bin, a pickle"):
        picospec.load_model(str(folder))


def test_unknown_dtype_unknown_name_and_missing_folder():
    with pytest.raises(PicospecError, match="unknown dtype 'int8'; use one of float32, bfloat16, float16"):
        picospec.load_model(str(SOURCE), dtype="int8")
    with pytest.raises(PicospecError, match="not a known model"):
        picospec.load_model("gpt3")
    with pytest.raises(PicospecError, match="no folder './no/such/folder'"):
        picospec.load_model("./no/such/folder")


def test_config_of_another_architecture_is_refused(tmp_path):
    folder = copy_checkpoint(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(PicospecError, match="'llama' model; picospec runs GPT-2 only"):
        picospec.load_model(str(folder))


def test_names_map_to_the_openai_hub_repos(monkeypatch):
    asked = []
    monkeypatch.setattr("huggingface_hub.hf_hub_download", lambda repo, filename: asked.append(repo) or "x")
    for name in ["gpt2", "124M", "gpt2-medium", "355M", "gpt2-large", "774M", "gpt2-xl", "1558M",
                 "someone/my-gpt2"]:
        weights.checkpoint_file(name, "config.json")
    assert asked == ["openai-community/gpt2"] * 2 + ["openai-community/gpt2-medium"] * 2 + \
        ["openai-community/gpt2-large"] * 2 + ["openai-community/gpt2-xl"] * 2 + ["someone/my-gpt2"]


def test_offline_with_an_empty_cache_says_what_to_do(tmp_path):
    code = "import picospec; picospec.load_model('gpt2')"
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "cannot get config.json of openai-community/gpt2" in out.stderr
    assert "HF_HUB_OFFLINE" in out.stderr and "local folder" in out.stderr


def test_hub_name_loads_from_a_populated_cache_offline(tmp_path):
    # The hub cache layout that hf_hub_download (and transformers) share: refs/main names a
    # snapshot folder holding the files.
    repo = tmp_path / "hub" / "models--openai-community--gpt2"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(SOURCE, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    code = ("import picospec, numpy as np; m = picospec.load_model('124M'); t = picospec.load_tokenizer('gpt2');"
            "print(m.config.n_head, t.get_vocab_size(), float(np.abs(picospec.logits(m, [1, 2, 3])).sum()))")
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    expected = float(np.abs(picospec.logits(picospec.load_model(str(SOURCE)), [1, 2, 3])).sum())
    n_head, vocab, total = out.stdout.split()
    assert (int(n_head), int(vocab)) == (3, 300)
    assert float(total) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("dtype", ["float32", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_loading_peak_memory_stays_under_1_3x_the_weights(tmp_path, dtype):
    # 150 MB of float32 weights: big enough that an extra full copy would show.
    config = picospec.GPT2Config(n_layer=12, n_head=8, n_embd=512, n_positions=256, vocab_size=1000, eos_token_id=0)
    rng = np.random.default_rng(0)  # the values do not matter here, only their bytes: drawn by numpy, at once
    params = jax.tree.map(lambda x: 0.02 * rng.standard_normal(x.shape, np.float32), expected(config))
    flat = checkpoint_tensors(params)
    folder = tmp_path / "big"
    folder.mkdir()
    save_file(flat, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config_json(config)))
    del params, flat
    ratio, _ = peak_ratio(str(folder), dtype)  # the 1558M check: python benchmarks/load_memory.py
    assert ratio < 1.3, f"peak resident memory was {ratio:.2f}x the weights"


@pytest.mark.parametrize("edit, message", [
    (lambda c: [c], "holds a JSON list, not an object"),
    (lambda c: {**c, "n_head": 0}, "n_head must be a whole number >= 1, got 0"),
    (lambda c: {**c, "n_layer": -1}, "n_layer must be a whole number >= 1, got -1"),
    (lambda c: {**c, "n_embd": "64"}, "n_embd must be a whole number >= 1, got '64'"),
    (lambda c: {**c, "vocab_size": 2.5}, "vocab_size must be a whole number >= 1, got 2.5"),
    (lambda c: {**c, "n_positions": True}, "n_positions must be a whole number >= 1, got True"),
    (lambda c: {**c, "layer_norm_epsilon": "small"}, "layer_norm_epsilon must be a number in"),
    (lambda c: {**c, "eos_token_id": 10 ** 9}, "eos_token_id must be a token id below vocab_size"),
    (lambda c: {k: v for k, v in c.items() if k != "n_embd"}, "lacks n_embd"),
    (lambda c: {**c, "n_head": 5}, "not divisible by n_head=5"),
    (lambda c: {**c, "activation_function": "relu"}, "only GPT-2's own MLP"),
])
def test_a_damaged_config_names_the_field(tmp_path, edit, message):
    folder = copy_checkpoint(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(edit(config)))
    with pytest.raises(PicospecError, match=message.replace("(", r"\(")) as e:
        picospec.load_model(str(folder))
    assert "\n" not in str(e.value)


SHARDED = DATA / "tiny-sharded"  # transformers' save_pretrained(max_shard_size="40KB"): 5 shards


def test_a_sharded_checkpoint_reads_only_the_shards_its_index_lists(tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(SHARDED, folder)
    (folder / "model-00009-of-00009.safetensors").write_bytes(b"not listed, never read")
    model = picospec.load_model(str(folder))
    same = picospec.load_model(str(SHARDED)).params["wte"]["weight"]
    np.testing.assert_array_equal(model.params["wte"]["weight"], same)
    assert len(weights.safetensors_files(str(folder))) == 5


def test_a_sharded_hub_repo_fetches_the_index_then_its_shards(monkeypatch):
    asked = []

    def fake_download(repo, filename):  # the hub, served from the committed folder
        asked.append(filename)
        if not (SHARDED / filename).exists():
            raise huggingface_hub.errors.EntryNotFoundError(f"{filename} not found")
        return str(SHARDED / filename)
    monkeypatch.setattr("huggingface_hub.hf_hub_download", fake_download)
    model = picospec.load_model("someone/sharded-gpt2")
    assert asked[:3] == ["config.json", "model.safetensors", "model.safetensors.index.json"]
    assert sorted(asked[3:]) == [f"model-0000{i}-of-00005.safetensors" for i in range(1, 6)]
    assert model.config.n_head == 4


@pytest.mark.parametrize("index, message", [
    ("not json", "has no valid weight_map"),
    ('{"weight_map": {}}', "has no valid weight_map"),
    ('{"weight_map": {"wte.weight": "../../etc/passwd"}}', "has no valid weight_map"),
    ('{"weight_map": {"wte.weight": "model-00007-of-00009.safetensors"}}',
     "model-00007-of-00009.safetensors is missing"),
])
def test_a_damaged_index_is_refused(tmp_path, index, message):
    folder = tmp_path / "sharded"
    shutil.copytree(SHARDED, folder)
    (folder / "model.safetensors.index.json").write_text(index)
    with pytest.raises(PicospecError, match=message):
        picospec.load_model(str(folder))


def test_a_shard_missing_a_tensor_is_named(tmp_path):
    folder = tmp_path / "sharded"
    shutil.copytree(SHARDED, folder)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    last = sorted(set(index["weight_map"].values()))[-1]
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != last}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PicospecError, match="missing tensor"):
        picospec.load_model(str(folder))


def offline_cli(tmp_path, populate):
    """The CLI on hub name 124M, offline, with a Hugging Face cache that `populate(repo_folder)` prepares."""
    repo = tmp_path / "hub" / "models--openai-community--gpt2"
    populate(repo)
    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "picospec", "--draft", "124M", "--target", "124M", "--n-tokens", "2"],
                          env=env, capture_output=True, text=True)


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def snapshot_without(filename):
    def populate(repo):
        shutil.copytree(SOURCE, repo / "snapshots" / COMMIT)
        (repo / "snapshots" / COMMIT / filename).unlink()
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(COMMIT)
    return populate


def interrupted_download(repo):
    snapshot_without("model.safetensors")(repo)
    (repo / "blobs").mkdir()
    (repo / "blobs" / "3f2a9c.incomplete").write_bytes(b"\0" * 1000)


@pytest.mark.parametrize("populate, message", [
    (snapshot_without("model.safetensors"), "cannot get model.safetensors of openai-community/gpt2: it is not in "
                                            "the Hugging Face cache and the hub is unreachable"),
    (snapshot_without("tokenizer.json"), "cannot get tokenizer.json of openai-community/gpt2"),
    (interrupted_download, "an interrupted download is in"),
])
def test_an_incomplete_hub_cache_offline_is_one_clear_line(tmp_path, populate, message):
    out = offline_cli(tmp_path, populate)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and message in out.stderr and "HF_HUB_OFFLINE" in out.stderr, out.stderr
