"""GPT-2 checkpoints for speed runs: the real one when it is in the Hugging Face cache, else one of
the same shape with random weights (speed does not depend on the values), written once."""

import json
import os
from pathlib import Path

import jax
from huggingface_hub import try_to_load_from_cache

from picospec.gpt2 import GPT2Config, init_params
from picospec.tools.checkpoints.config import config_json
from picospec.tools.checkpoints.tensors import save_params
from picospec.tools.checkpoints.weights import HUB_REPOS

SHAPES = {"gpt2": dict(n_layer=12, n_head=12, n_embd=768), "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600)}
RANDOM_DIR = Path(os.environ.get("PICOSPEC_BENCH_DIR", Path.home() / ".cache" / "picospec" / "bench"))


def resolve(name: str) -> tuple[str, bool]:
    """(name or folder, is_real): the real checkpoint if cached, else a random one of its shape."""
    if name not in SHAPES:
        return name, True
    if isinstance(try_to_load_from_cache(HUB_REPOS[name], "model.safetensors"), str):  # cache only
        return name, True
    folder = RANDOM_DIR / f"random-{name}"
    if not (folder / "model.safetensors").exists():  # GPT-2's own init, in the hub's layout (transformers reads it)
        config = GPT2Config(**SHAPES[name])
        folder.mkdir(parents=True, exist_ok=True)
        save_params(init_params(config, jax.random.key(0)), folder / "model.safetensors")
        (folder / "config.json").write_text(json.dumps(config_json(config), indent=2) + "\n")
    return str(folder), False
