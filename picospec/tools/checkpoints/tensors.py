"""safetensors files <-> a GPT-2 params pytree.

The safetensors library opens every file first and checks its header (JSON, each entry's dtype, shape
and offsets, the file's size), so nothing malformed reaches the code below; nothing is ever unpickled.
The data are then read tensor by tensor with plain reads, not a memory map: a mapping would keep
every page it touched resident until it closed, a second copy of the weights. Only the params stay.
"""

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from picospec.errors import PicospecError
from picospec.gpt2 import GPT2Config

FILE_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": jnp.bfloat16}
# Tensors a checkpoint may hold that the model does not need: the hub files carry each layer's
# causal-mask buffers, and the LM head is tied to wte.
SKIPPED = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)|lm_head\.weight")
# GPT-2's Conv1D weights, stored [in, out] in the checkpoint and kept [out, in] in params (see gpt2.py).
CONV1D = re.compile(r"h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight")


def load_params(paths: list[Path], config: GPT2Config, dtype, wanted: dict | None = None) -> dict:
    """Every tensor GPT-2 needs, from one safetensors file or a checkpoint's shards, as a params pytree of `dtype`;
    names, dtypes and shapes checked against config.json (or the ShapeDtypeStructs `wanted`: an EAGLE head's)."""
    where = {}  # bare tensor name -> (file, its entry)
    for path in paths:
        for key, entry in _entries(path).items():
            name = key.removeprefix("transformer.")  # transformers' save_pretrained prefixes the hub's keys
            if name in where:
                raise PicospecError(f"tensor {key} is in both {where[name][0]} and {path}; download the "
                                    "checkpoint again")
            where[name] = (path, entry)
    wanted = expected(config) if wanted is None else wanted
    names = {_dotted(p) for p, _ in jax.tree_util.tree_flatten_with_path(wanted)[0]}
    if missing := sorted(names - where.keys()):
        raise PicospecError(f"{paths[0].parent}: missing tensor {missing[0]} ({len(missing)} missing); "
                            "is this a GPT-2 checkpoint matching its config.json?")
    if unexpected := sorted(k for k in where.keys() - names if not SKIPPED.fullmatch(k)):
        raise PicospecError(f"{where[unexpected[0]][0]}: unexpected tensor {unexpected[0]}; is this a GPT-2 "
                            "checkpoint?")

    def load(key_path, expected):
        name = _dotted(key_path)
        path, (key, file_dtype, shape, begin) = where[name]
        conv1d = CONV1D.fullmatch(name)
        stored = expected.shape[::-1] if conv1d else expected.shape  # as the file stores it
        if shape != stored:
            raise PicospecError(f"{path}: tensor {key} has shape {shape}, but config.json implies {stored}; "
                                "pick the config.json of this model")
        if file_dtype not in FILE_DTYPES:
            raise PicospecError(f"{path}: tensor {key} is {file_dtype}; picospec reads {', '.join(FILE_DTYPES)} "
                                "weights: convert the checkpoint")
        host = np.empty(shape, FILE_DTYPES[file_dtype])  # one tensor as the file holds it
        _read_exactly(path, begin, host)
        if not np.isfinite(host).all():  # found here, not as garbage tokens later
            raise PicospecError(f"{path}: tensor {key} holds NaN or Inf values; the checkpoint is damaged: "
                                "download it again")
        array = _aligned_empty(expected.shape, dtype)
        with np.errstate(over="ignore"):  # a value past the dtype's range is reported just below
            np.copyto(array, host.T if conv1d else host, casting="unsafe")  # the transpose, once, at load
        if not np.isfinite(array).all():
            raise PicospecError(f"{path}: tensor {key} has values too large for {np.dtype(dtype).name}; "
                                "load it as float32 or bfloat16 (--dtype)")
        return jax.device_put(array, may_alias=False)

    return jax.tree_util.tree_map_with_path(load, wanted)


def expected(config: GPT2Config) -> dict:
    """The params pytree gpt2.init_params makes, as the shapes a checkpoint must hold (the tree
    jax.eval_shape(init_params) gives, without tracing 2 + 4 n_layer random draws on every load: 0.03-0.1 s
    for GPT-2 124M's shapes, 0.13-0.3 s for 1558M's; tests/test_weights.py checks that the two agree)."""
    C = config.n_embd

    def leaf(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    def layer(*shape):  # its weight: [out, in] (a norm's: [C]); its bias: [out]
        return {"weight": leaf(*shape), "bias": leaf(shape[0])}

    def block():
        return {"ln_1": layer(C), "attn": {"c_attn": layer(3 * C, C), "c_proj": layer(C, C)},
                "ln_2": layer(C), "mlp": {"c_fc": layer(4 * C, C), "c_proj": layer(C, 4 * C)}}

    return {"wte": {"weight": leaf(config.vocab_size, C)}, "wpe": {"weight": leaf(config.n_positions, C)},
            "h": [block() for _ in range(config.n_layer)], "ln_f": layer(C)}


def _entries(path: Path) -> dict:
    """{key: (key, dtype, shape, first byte)} of each tensor in a safetensors file."""
    try:
        with safe_open(path, framework="numpy"):  # the library validates the header and the size
            pass
    except (SafetensorError, OSError) as e:
        raise PicospecError(f"{path} is not a valid safetensors file ({first_line(e)}); download it "
                            "again, or save it again with safetensors") from None
    with open(path, "rb") as f:  # valid now: 8 bytes of header length, the JSON header, the data
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return {k: (k, e["dtype"], tuple(e["shape"]), 8 + n + e["data_offsets"][0])
            for k, e in header.items() if k != "__metadata__"}


def _aligned_empty(shape, dtype, alignment=64):
    """An uninitialised host array, 64-byte aligned. It is still copied into XLA's memory (device_put with
    may_alias=False, as jnp.asarray does, but compiling no small program per tensor shape), yet an unaligned one peaks
    higher (the suite's 150 MB checkpoint in bfloat16: 1.29x the weights aligned, 1.35x not). Adopting it without a copy
    made loading 1558M take 14 s against 8.6 s: the transpose writes into fresh pages, faulting each in mid-stride."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def _read_exactly(path: Path, begin: int, out: np.ndarray):
    view = memoryview(out.reshape(-1).view(np.uint8))
    with open(path, "rb", buffering=0) as f:
        f.seek(begin)
        done = 0
        while done < len(view):  # one read may return less (e.g. 2 GiB at most on Linux)
            n = f.readinto(view[done:])
            if not n:
                raise PicospecError(f"{path} ended while reading its tensors; download it again")
            done += n


def first_line(e: Exception) -> str:  # an exception's message, for a one-line error
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _dotted(key_path) -> str:  # (DictKey('h'), SequenceKey(0), DictKey('ln_1'), ...) -> "h.0.ln_1..."
    return ".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in key_path)


def checkpoint_tensors(params: dict, dtype=np.float32) -> dict:
    """params -> {hub key name: numpy array of dtype}, Conv1D weights back in the file's [in, out]."""
    flat = {}
    for key_path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        name, x = _dotted(key_path), np.asarray(x, np.float32).astype(dtype)
        flat[name] = np.ascontiguousarray(x.T if CONV1D.fullmatch(name) else x)
    return flat


def save_params(params: dict, path: Path, dtype=np.float32):
    save_file(checkpoint_tensors(params, dtype), path, metadata={"format": "pt"})
