"""Finding a checkpoint (bundled, local folder or Hugging Face hub) and loading it as a Model.

A checkpoint is a folder in Hugging Face's GPT-2 layout: config.json, tokenizer.json, and model.safetensors or, sharded,
model.safetensors.index.json and the shards it lists. Only safetensors is read (tensors.py); nothing is unpickled.
"""

import importlib.resources
import json
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from tokenizers import Tokenizer

from picospec import fastpath
from picospec.errors import PicospecError
from picospec.gpt2 import Model, logits
from picospec.tools.checkpoints.config import config_json, read_config
from picospec.tools.checkpoints.tensors import first_line, load_params, save_params
from picospec.tools.memory import run_device

SIZES = {"gpt2": "124M", "gpt2-medium": "355M", "gpt2-large": "774M", "gpt2-xl": "1558M"}  # OpenAI's GPT-2s
HUB_REPOS = {name: f"openai-community/{repo}" for repo, size in SIZES.items() for name in (repo, size)}
BUNDLED = ("tiny-draft", "tiny-target", "tiny-head")  # in weights/, shipped in the wheel as picospec.weights
BUNDLED_DIR = Path(str(importlib.resources.files("picospec.weights")))
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
WEIGHTS, INDEX = "model.safetensors", "model.safetensors.index.json"


class MissingFile(PicospecError):
    """The checkpoint has no such file (a sharded one has no model.safetensors)."""


def checkpoint_file(name_or_path: str, filename: str) -> Path:
    """The local path of `filename` for a model name, hub repo id or folder (downloading if needed)."""
    if name_or_path in BUNDLED:
        return _folder_file(BUNDLED_DIR / name_or_path, filename)
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        return _folder_file(folder, filename)
    repo = HUB_REPOS.get(name_or_path)
    if repo is None and re.fullmatch(r"[\w-][\w.-]*/[\w.-]+", name_or_path) and not folder.exists():
        repo = name_or_path  # an owner/name hub repo id
    if repo is None:
        raise PicospecError(f"no folder {name_or_path!r}, and it is not a known model "
                            f"({', '.join([*HUB_REPOS, *BUNDLED])}) or a hub repo id (owner/name)")
    return _hub_file(repo, filename)


def _folder_file(folder: Path, filename: str) -> Path:
    path = folder / filename
    if path.is_file():
        return path
    if filename == "model.safetensors" and (folder / "pytorch_model.bin").exists():
        raise PicospecError(f"{folder} holds only pytorch_model.bin, a pickle, which picospec never "
                            "loads; convert it to model.safetensors (e.g. save_pretrained in transformers)")
    raise MissingFile(f"{path} is missing; a checkpoint folder needs config.json, tokenizer.json and "
                      "model.safetensors (or model.safetensors.index.json and its shards)")


def _hub_file(repo: str, filename: str) -> Path:
    # hf_hub_download uses the standard cache (shared with transformers) and honours HF_HOME, HF_HUB_OFFLINE and
    # HF_TOKEN; it shows its own progress bars. Imported here: a local or bundled checkpoint does not wait for it.
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub import errors as hub_errors
    try:
        return Path(hf_hub_download(repo, filename))
    except hub_errors.LocalEntryNotFoundError:
        cached = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
        interrupted = any((cached / "blobs").glob("*.incomplete"))
        hint = f" (an interrupted download is in {cached}: connect again to finish it)" if interrupted else ""
        raise PicospecError(f"cannot get {filename} of {repo}: it is not in the Hugging Face cache{hint} and the hub "
                            "is unreachable (or HF_HUB_OFFLINE=1); connect once, or pass a local folder") from None
    except (hub_errors.RepositoryNotFoundError, hub_errors.GatedRepoError):
        raise PicospecError(f"hub repo {repo!r} not found or not accessible; check the name, "
                            "or set HF_TOKEN for a private repo") from None
    except hub_errors.EntryNotFoundError:
        hint = "; picospec loads safetensors only" if filename.endswith(".safetensors") else ""
        raise MissingFile(f"hub repo {repo!r} has no {filename}{hint}") from None
    except (hub_errors.HfHubHTTPError, OSError) as e:
        raise PicospecError(f"cannot download {filename} of {repo} ({type(e).__name__}); check the network, or "
                            "set HF_HUB_OFFLINE=1 to use the cache, or pass a local folder") from None


def load_model(name_or_path: str, dtype: str | None = None) -> Model:
    """Load a GPT-2 checkpoint.

    Args:
      name_or_path: gpt2 / 124M, gpt2-medium / 355M, gpt2-large / 774M, gpt2-xl / 1558M,
        tiny-draft / tiny-target (bundled), a hub repo id (owner/name) or a local folder.
      dtype: "float32", "bfloat16" or "float16": the dtype of the params and the cache (None: float32 on
        a CPU, bfloat16 on a GPU or TPU, fastpath.default_dtype).
    Returns:
      Model with .config (GPT2Config) and .params (pytree named after the checkpoint's tensors).
    """
    dtype = dtype or fastpath.default_dtype(run_device().platform)
    if dtype not in DTYPES:
        raise PicospecError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    config = read_config(checkpoint_file(name_or_path, "config.json"))
    params = load_params(safetensors_files(name_or_path), config, DTYPES[dtype])
    model = fastpath.fast(Model(config, params))
    # float16 holds at most 65504: a checkpoint whose activations pass it computes Inf and NaN, and would sample
    # garbage. One forward pass over a probe text (the first tokens of the vocabulary) finds most such models.
    probe = np.arange(min(32, config.n_positions)) % config.vocab_size
    if dtype == "float16" and not np.isfinite(np.asarray(logits(model, probe))).all():
        raise PicospecError(f"{name_or_path} overflows float16 (its activations pass 65504 on a probe text, giving "
                            "Inf and NaN): use --dtype bfloat16 or float32")
    return model


def safetensors_files(name_or_path: str) -> list[Path]:
    """[model.safetensors], or the shards that model.safetensors.index.json lists (only those fetched)."""
    try:
        return [checkpoint_file(name_or_path, WEIGHTS)]
    except MissingFile as missing:
        try:
            index = checkpoint_file(name_or_path, INDEX)
        except MissingFile:
            raise missing from None
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
    except (OSError, ValueError, AttributeError):
        weight_map = None
    shards = set(weight_map.values()) if isinstance(weight_map, dict) else set()
    if not shards or not all(isinstance(s, str) and re.fullmatch(r"[\w.-]+\.safetensors", s) for s in shards):
        raise PicospecError(f"{index} has no valid weight_map (tensor name -> shard file name); download it again")
    return [checkpoint_file(name_or_path, shard) for shard in sorted(shards)]


def load_tokenizer(name_or_path: str, model: Model | None = None) -> Tokenizer:
    """The checkpoint's tokenizer.json, as a `tokenizers.Tokenizer`; with `model`, checked to fit its
    vocabulary (a larger tokenizer would produce ids the model has no embedding for)."""
    path = checkpoint_file(name_or_path, "tokenizer.json")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        raise PicospecError(f"{path} is not a valid tokenizer.json ({first_line(e)}); download it again") from None
    if model is not None:
        check_tokenizer(tokenizer, model, path)
    return tokenizer


def check_tokenizer(tokenizer: Tokenizer, model: Model, path):
    """A tokenizer must not produce ids the model has no embedding for."""
    if tokenizer.get_vocab_size() > model.config.vocab_size:
        raise PicospecError(f"{path} has {tokenizer.get_vocab_size()} tokens but the model's vocabulary has "
                            f"{model.config.vocab_size}: pick the tokenizer.json that came with the model")


def eos_token_id(model: Model, tokenizer: Tokenizer) -> int | None:
    """<|endoftext|>: from config.json if it says, else from the tokenizer."""
    eos = model.config.eos_token_id
    return eos if eos is not None else tokenizer.token_to_id("<|endoftext|>")


def save_checkpoint(model: Model, tokenizer: Tokenizer, folder: Path, dtype=np.float32):
    """Write a Hugging Face GPT-2 folder (hub key names, tensors as dtype) that picospec and transformers load."""
    folder.mkdir(parents=True, exist_ok=True)
    save_params(model.params, folder / "model.safetensors", dtype)
    (folder / "config.json").write_text(json.dumps(config_json(model.config), indent=2) + "\n")
    tokenizer.save(str(folder / "tokenizer.json"))
