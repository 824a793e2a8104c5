"""Finding a checkpoint (bundled, local folder or Hugging Face hub) and loading it as params.

A checkpoint is a folder in the Hugging Face GPT-2 layout: config.json, model.safetensors and
tokenizer.json. Only safetensors is read; nothing is ever unpickled. Tensors are read one by one from
the memory-mapped file and each one's pages are dropped once it is on the device, so loading never
holds a second full copy of the weights.
"""

import json
import mmap
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from huggingface_hub import hf_hub_download
from safetensors.numpy import save_file
from huggingface_hub import errors as hub_errors
from tokenizers import Tokenizer

from picospec.config import GPT2Config
from picospec.errors import PicospecError
from picospec.gpt2 import Model, init_params

HUB_REPOS = {
    "gpt2": "openai-community/gpt2", "124M": "openai-community/gpt2",
    "gpt2-medium": "openai-community/gpt2-medium", "355M": "openai-community/gpt2-medium",
    "gpt2-large": "openai-community/gpt2-large", "774M": "openai-community/gpt2-large",
    "gpt2-xl": "openai-community/gpt2-xl", "1558M": "openai-community/gpt2-xl",
}
BUNDLED_DIR = Path(__file__).resolve().parents[2] / "weights"  # holds tiny-draft, tiny-target
BUNDLED = ("tiny-draft", "tiny-target")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
FILE_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": jnp.bfloat16}
# Tensors a checkpoint may hold that the model does not need: the hub files carry each layer's
# causal-mask buffers, and the LM head is tied to wte.
SKIPPED = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight")
# GPT-2's Conv1D weights, stored [in, out] in the checkpoint and kept [out, in] in params (see gpt2.py).
CONV1D = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight")


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
        known = ", ".join([*HUB_REPOS, *BUNDLED])
        raise PicospecError(f"no folder {name_or_path!r}, and it is not a known model ({known}) "
                            "or a hub repo id (owner/name)")
    return _hub_file(repo, filename)


def _folder_file(folder: Path, filename: str) -> Path:
    path = folder / filename
    if path.is_file():
        return path
    if filename == "model.safetensors" and (folder / "pytorch_model.bin").exists():
        raise PicospecError(f"{folder} holds only pytorch_model.bin, a pickle, which picospec never "
                            "loads; convert it to model.safetensors (e.g. save_pretrained in transformers)")
    raise PicospecError(f"{path} is missing; a checkpoint folder needs config.json, "
                        "model.safetensors and tokenizer.json")


def _hub_file(repo: str, filename: str) -> Path:
    # hf_hub_download uses the standard cache (shared with transformers) and honours HF_HOME,
    # HF_HUB_OFFLINE and HF_TOKEN; it shows its own progress bars.
    try:
        return Path(hf_hub_download(repo, filename))
    except hub_errors.LocalEntryNotFoundError:
        raise PicospecError(f"cannot get {filename} of {repo}: it is not in the Hugging Face cache and the "
                            "hub is unreachable (or HF_HUB_OFFLINE=1); connect once, or pass a local "
                            "folder") from None
    except (hub_errors.RepositoryNotFoundError, hub_errors.GatedRepoError):
        raise PicospecError(f"hub repo {repo!r} not found or not accessible; check the name, "
                            "or set HF_TOKEN for a private repo") from None
    except hub_errors.EntryNotFoundError:
        hint = "; picospec loads safetensors only" if filename.endswith(".safetensors") else ""
        raise PicospecError(f"hub repo {repo!r} has no {filename}{hint}") from None
    except (hub_errors.HfHubHTTPError, OSError) as e:
        raise PicospecError(f"cannot download {filename} of {repo} ({type(e).__name__}); check the "
                            "network, or set HF_HUB_OFFLINE=1 to use the cache, or pass a local "
                            "folder") from None


def load_model(name_or_path: str, dtype: str = "float32") -> Model:
    """Load a GPT-2 checkpoint.

    Args:
      name_or_path: gpt2 / 124M, gpt2-medium / 355M, gpt2-large / 774M, gpt2-xl / 1558M,
        tiny-draft / tiny-target (bundled), a hub repo id (owner/name) or a local folder.
      dtype: "float32" (default), "bfloat16" or "float16": the dtype of the params and the cache.
    Returns:
      Model with .config (GPT2Config) and .params (pytree named after the checkpoint's tensors).
    """
    if dtype not in DTYPES:
        raise PicospecError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    config = GPT2Config.from_json(checkpoint_file(name_or_path, "config.json"))
    params = load_params(checkpoint_file(name_or_path, "model.safetensors"), config, DTYPES[dtype])
    return Model(config, params)


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """The checkpoint's tokenizer.json, as a `tokenizers.Tokenizer`."""
    path = checkpoint_file(name_or_path, "tokenizer.json")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        raise PicospecError(f"{path} is not a valid tokenizer.json ({str(e).splitlines()[0]})") from None


def eos_token_id(model: Model, tokenizer: Tokenizer) -> int | None:
    """<|endoftext|>: from config.json if it says, else from the tokenizer."""
    if model.config.eos_token_id is not None:
        return model.config.eos_token_id
    return tokenizer.token_to_id("<|endoftext|>")


def load_params(path: Path, config: GPT2Config, dtype) -> dict:
    """Read every tensor GPT-2 needs from a safetensors file, checking names and shapes."""
    header, data_start, file_size = _read_header(path)
    stored = {_bare(k): k for k in header if k != "__metadata__"}  # bare name -> key in the file
    wanted = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))  # the expected pytree
    names = {_dotted(p) for p, _ in jax.tree_util.tree_flatten_with_path(wanted)[0]}
    if missing := sorted(names - stored.keys()):
        raise PicospecError(f"{path}: missing tensor {missing[0]} ({len(missing)} missing); "
                            "is this a GPT-2 checkpoint matching its config.json?")
    if unexpected := sorted(k for k in stored.keys() - names if not SKIPPED.fullmatch(k)):
        raise PicospecError(f"{path}: unexpected tensor {stored[unexpected[0]]}; "
                            "is this a GPT-2 checkpoint?")

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        def load(key_path, expected):
            name = _dotted(key_path)
            entry = header[stored[name]]
            conv1d = CONV1D.fullmatch(name)
            shape = expected.shape[::-1] if conv1d else expected.shape  # as the file stores it
            if tuple(entry["shape"]) != shape:
                raise PicospecError(f"{path}: tensor {stored[name]} has shape {tuple(entry['shape'])}, "
                                    f"but config.json implies {shape}")
            begin, end = (data_start + o for o in entry["data_offsets"])
            file_dtype = FILE_DTYPES.get(entry["dtype"])
            if file_dtype is None or end > file_size or end - begin != expected.size * np.dtype(file_dtype).itemsize:
                raise PicospecError(f"{path} is truncated or corrupt at tensor {stored[name]}; "
                                    "download it again")
            host = np.frombuffer(mm, file_dtype, expected.size, begin).reshape(shape)
            array = _aligned_empty(expected.shape, dtype)
            np.copyto(array, host.T if conv1d else host, casting="unsafe")  # read, converting the dtype
            del host  # release the view so the mapping can close
            page = (begin // mmap.PAGESIZE) * mmap.PAGESIZE
            mm.madvise(mmap.MADV_DONTNEED, page, end - page)  # drop the file pages just read
            return jnp.asarray(array)

        return jax.tree_util.tree_map_with_path(load, wanted)


def _aligned_empty(shape, dtype, alignment=64):
    """An uninitialised host array at a 64-byte boundary: on CPU, jax adopts such a buffer as is,
    so the weights exist once; on an accelerator it is copied over and freed."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _read_header(path: Path):
    """safetensors: 8 bytes of little-endian header length, a JSON header, then the raw data."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        prefix = f.read(8)
        n = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        try:
            if not 0 < n <= size - 8:
                raise ValueError("bad header length")
            header = json.loads(f.read(n))
            assert isinstance(header, dict)
        except (ValueError, AssertionError):
            raise PicospecError(f"{path} is not a valid safetensors file (truncated or corrupt); "
                                "download or save it again") from None
    return header, 8 + n, size


def _bare(key: str) -> str:  # transformers' save_pretrained prefixes the hub's keys
    return key.removeprefix("transformer.")


def _dotted(key_path) -> str:  # (DictKey('h'), SequenceKey(0), DictKey('ln_1'), ...) -> "h.0.ln_1..."
    return ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in key_path)


def checkpoint_tensors(params: dict, dtype=np.float32) -> dict:
    """params -> {hub key name: numpy array of dtype}, Conv1D weights back in the file's [in, out]."""
    flat = {}
    for key_path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        name, x = _dotted(key_path), np.asarray(x, np.float32).astype(dtype)
        flat[name] = np.ascontiguousarray(x.T if CONV1D.fullmatch(name) else x)
    return flat


def save_checkpoint(model: Model, tokenizer: Tokenizer, folder: Path, dtype=np.float32):
    """Write a Hugging Face GPT-2 folder (hub key names, tensors stored as dtype) that picospec and
    transformers load."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(checkpoint_tensors(model.params, dtype), folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(model.config.to_json(), indent=2) + "\n")
    tokenizer.save(str(folder / "tokenizer.json"))
