"""GPT-2 hyperparameters <-> a checkpoint's config.json, checked field by field."""

import json
from pathlib import Path

from picospec.errors import PicospecError
from picospec.gpt2 import GPT2Config
from picospec.tools.checks import whole


def read_config(path: Path) -> GPT2Config:
    """Read and check config.json: every field GPT-2 needs, of the right type and in range."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise PicospecError(f"cannot read {path}: {e}; is this a GPT-2 checkpoint folder?") from None
    if not isinstance(raw, dict):
        raise PicospecError(f"{path} holds a JSON {type(raw).__name__}, not an object; is this a GPT-2 config.json?")
    if raw.get("model_type", "gpt2") != "gpt2":
        raise PicospecError(f"{path} describes a {raw['model_type']!r} model; picospec runs GPT-2 only")
    fields = {f: raw[f] for f in GPT2Config.__dataclass_fields__ if f in raw}
    if missing := {"n_layer", "n_head", "n_embd", "vocab_size"} - fields.keys():
        raise PicospecError(f"{path} lacks {', '.join(sorted(missing))}; is this a GPT-2 config.json?")
    for name in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size"):
        value = fields.get(name, 1)
        _check(path, name, value, whole(value) and value >= 1, "a whole number >= 1")
    eps = fields.get("layer_norm_epsilon", 1e-5)
    _check(path, "layer_norm_epsilon", eps, isinstance(eps, (int, float)) and not isinstance(eps, bool)
           and 0 < eps < 1, "a number in (0, 1)")
    eos = fields.get("eos_token_id")
    _check(path, "eos_token_id", eos, eos is None or (whole(eos) and 0 <= eos < fields["vocab_size"]),
           f"a token id below vocab_size ({fields['vocab_size']}) or null")
    if raw.get("n_inner") not in (None, 4 * fields["n_embd"]) or \
            raw.get("activation_function", "gelu_new") != "gelu_new":
        raise PicospecError(f"{path}: only GPT-2's own MLP (n_inner = 4 n_embd, gelu_new) is supported")
    config = GPT2Config(**fields)
    if config.n_embd % config.n_head:
        raise PicospecError(f"{path}: n_embd={config.n_embd} is not divisible by n_head={config.n_head}")
    return config


def config_json(config: GPT2Config) -> dict:
    """The fields transformers' GPT2Config reads, so transformers can load what we write."""
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "activation_function": "gelu_new",
            "n_ctx": config.n_positions, "bos_token_id": config.eos_token_id, "tie_word_embeddings": True,
            **{f: getattr(config, f) for f in config.__dataclass_fields__}}


def _check(path, name, value, ok: bool, wanted: str):
    if not ok:
        raise PicospecError(f"{path}: {name} must be {wanted}, got {value!r}; the file is damaged or not "
                            "a GPT-2 config.json")
