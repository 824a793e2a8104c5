"""An EAGLE head's checkpoint (beyond/eagle.py): config.json (model_type "picospec-eagle-head", the
target it was trained against, and a fingerprint of that target's embedding) and model.safetensors
(fc.*, block.* with GPT-2's key names). A head drafts only for its own target: the features it reads
and the embedding and LM head it borrows are that target's, so another target is refused."""

import json
from pathlib import Path

import jax
import numpy as np

from picospec.beyond.eagle import HeadDraft
from picospec.errors import PicospecError
from picospec.gpt2 import Model
from picospec.tools.checkpoints.tensors import expected, load_params, save_params
from picospec.tools.checkpoints.weights import WEIGHTS, checkpoint_file

HEAD_TYPE = "picospec-eagle-head"
FINGERPRINT_ROWS = 8  # rows of the target's token embedding kept to recognise it


def fingerprint(target: Model) -> list[float]:
    """A few numbers that tell one target from another: the first entries of some embedding rows."""
    wte = np.asarray(target.params["wte"]["weight"], np.float32)
    rows = np.linspace(0, wte.shape[0] - 1, FINGERPRINT_ROWS).astype(int)
    return [round(float(x), 4) for x in wte[rows, :4].ravel()]


def is_head(config_path: Path) -> bool:
    try:
        return json.loads(Path(config_path).read_text()).get("model_type") == HEAD_TYPE
    except (OSError, ValueError, AttributeError):
        return False  # read_config says what is wrong with it


def save_head(head: HeadDraft, target_name: str, folder: Path, dtype=np.float16, extra: dict | None = None):
    """Write `head` (trained against head.target, called target_name) to folder."""
    folder.mkdir(parents=True, exist_ok=True)
    about = {"model_type": HEAD_TYPE, "target": target_name, "n_embd": head.config.n_embd, "n_head": head.config.n_head,
             "vocab_size": head.config.vocab_size, "target_fingerprint": fingerprint(head.target)}
    (folder / "config.json").write_text(json.dumps(about | (extra or {}), indent=2) + "\n")
    save_params(head.params, folder / "model.safetensors", dtype)


def load_head(name_or_path: str, target: Model) -> HeadDraft:
    """The EAGLE head `name_or_path` (tiny-head, bundled; a hub repo id or a local folder) drafting for
    `target`, in the target's dtype; a head trained against another target is refused."""
    name, config = name_or_path, target.config
    raw = json.loads(checkpoint_file(name, "config.json").read_text())
    if raw.get("model_type") != HEAD_TYPE:
        raise PicospecError(f"{name} is not an EAGLE head (its config.json says model_type "
                            f"{raw.get('model_type')!r}); load a draft model with load_model")
    if [raw.get(k) for k in ("n_embd", "n_head", "vocab_size")] != [config.n_embd, config.n_head, config.vocab_size]:
        raise PicospecError(f"{name} is an EAGLE head for a {raw.get('n_embd')}-wide target of "
                            f"{raw.get('vocab_size')} tokens ({raw.get('target')}); this target is {config.n_embd} "
                            f"wide with {config.vocab_size}: use it with {raw.get('target')}")
    if not np.allclose(fingerprint(target), raw.get("target_fingerprint", []), atol=2e-2):
        raise PicospecError(f"{name} is an EAGLE head trained against {raw.get('target')}, and this target's "
                            f"embedding is not that model's: use --target {raw.get('target')}")
    C, dtype = config.n_embd, target.params["wte"]["weight"].dtype
    fc = {"weight": jax.ShapeDtypeStruct((C, 2 * C), np.float32), "bias": jax.ShapeDtypeStruct((C,), np.float32)}
    wanted = {"fc": fc, "block": expected(config)["h"][0]}
    return HeadDraft(load_params([checkpoint_file(name, WEIGHTS)], config, dtype, wanted), config, target)
