"""The costs `--K auto` weighs (picospec/adaptive.py): c, one draft call over one target call, and
v(k), the target scoring k + 1 tokens over scoring one, for k = 1..K_max.

They depend on the machine and the pair, not on the prompt, so they are timed once, at start-up (a
few compiled loops of forward calls, raced in turn: tools/timing.forward_times), and kept in
costs.json beside the compile cache (tools/jit_cache.py), keyed by the device, both models' shapes
and dtypes, K_max and the cache capacity. Deleting the file only costs the timing again.
"""

import json

import jax
import jax.numpy as jnp

from picospec import adaptive
from picospec.gpt2 import Model
from picospec.tools.jit_cache import cache_folder
from picospec.tools.timing import forward_times


def describe(model) -> str:
    if not isinstance(model, Model):
        return type(model).__name__
    c = model.config
    return (f"L{c.n_layer}H{c.n_head}C{c.n_embd}V{c.vocab_size}P{c.n_positions}"
            f"-{model.params['wte']['weight'].dtype}")


def measure(draft, target: Model, K_max: int, capacity: int) -> dict:
    """{"c": float, "v": [v(1), ..., v(K_max)]} timed now. A draft that is not a model (the n-gram
    lookup) costs nothing beside a forward call: c = 0."""
    calls = {f"target {k + 1}": (target, k + 1) for k in range(K_max + 1)}
    if isinstance(draft, Model):
        calls["draft 1"] = (draft, 1)
    t = forward_times(calls, capacity=min(capacity, target.config.n_positions), min_seconds=0.02, rounds=3)
    one = t["target 1"]
    return {"c": t["draft 1"] / one if "draft 1" in t else 0.0,
            "v": [t[f"target {k + 1}"] / one for k in range(1, K_max + 1)]}


def costs(draft, target: Model, K_max: int, capacity: int) -> dict:
    """measure(...), or what an earlier run on this machine measured for the same pair and sizes."""
    device = jax.devices()[0]
    key = f"{device.platform}:{device.device_kind}:{describe(draft)}:{describe(target)}:K{K_max}:S{capacity}"
    folder = cache_folder()
    path = folder.parent / "costs.json" if folder else None
    try:
        known = json.loads(path.read_text()) if path and path.exists() else {}
    except (OSError, ValueError):
        known = {}  # unreadable: time it again and write it afresh
    if key not in known:
        known[key] = measure(draft, target, K_max, capacity)
        if path:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(known, indent=1))
            except OSError:
                pass  # a read-only cache folder: measure again next time
    return known[key]


def auto_policy(draft, target: Model, K_max: int, capacity: int, threshold: float = 0.0) -> adaptive.Policy:
    """The Policy for `--K auto`: this machine's c and v(k), and the confidence threshold."""
    measured = costs(draft, target, K_max, capacity)
    return adaptive.Policy(jnp.float32(measured["c"]), jnp.float32(measured["v"]), jnp.float32(threshold))
