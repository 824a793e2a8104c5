"""Compile once per machine: JAX's persistent compilation cache, in a per-user folder.

Compiling the forward pass and the sampling loops takes seconds (10-15 s for GPT-2 1558M); the compiled programs depend
only on the shapes, dtypes and static options, not on the prompt. So the CLI and the benchmark keep them on disk, and a
second run of the same command loads them instead (programs.py keeps the exported programs in programs/ there, so that a
second run does not trace either, and autotune/ the iteration costs `--K auto` weighs, in costs.json: `remembered`).

The folder is $PICOSPEC_JIT_CACHE if set, else $XDG_CACHE_HOME/picospec/jit (~/.cache/picospec/jit);
PICOSPEC_JIT_CACHE=off turns it off. It keeps at most 1 GiB (the GPT-2 pair's programs take ~1 MB: the weights are
arguments, not constants); deleting it is safe, costing only a recompile. A user's JAX_COMPILATION_CACHE_DIR wins.
"""

import json
import os
from contextlib import suppress
from pathlib import Path

import jax


def cache_folder() -> Path | None:
    """Where compiled programs are kept, or None when the cache is off."""
    setting = os.environ.get("PICOSPEC_JIT_CACHE")
    if setting is not None:
        return None if setting.lower() in ("", "off", "0", "false", "no") else Path(setting).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "picospec" / "jit"


def use_persistent_cache() -> Path | None:
    """Turn the persistent compilation cache on (for every compile from now on); returns its folder."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):  # the user's own choice wins
        return Path(os.environ["JAX_COMPILATION_CACHE_DIR"])
    folder = cache_folder()
    for name, value in (settings(folder) if folder else {}).items():
        jax.config.update(name, value)
    return folder


def settings(folder: Path) -> dict:
    """The JAX options use_persistent_cache sets (for the whole process)."""
    return {"jax_compilation_cache_dir": str(folder),
            "jax_persistent_cache_min_compile_time_secs": 0.0,  # even the sub-second ones add up
            "jax_persistent_cache_min_entry_size_bytes": 0,
            "jax_compilation_cache_max_size": 1 << 30}  # least recently used go beyond 1 GiB


def remembered(key: str, compute) -> dict:
    """compute(), a dict, kept in costs.json in the compile cache's folder under key: what an earlier run
    on this machine found, if it did. Unreadable or of an older form: computed and written afresh."""
    path, known = kept()
    if not isinstance(known.get(key), dict):  # not timed yet (or in an older form)
        known[key] = compute()
        if path:  # the cache is on (a read-only folder: measure again next time)
            with suppress(OSError):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(known, indent=1))
    return known[key]


def kept() -> tuple[Path | None, dict]:
    """costs.json's path (None: the cache is off) and what it holds ({}: nothing, or unreadable)."""
    folder = cache_folder()
    path = folder / "costs.json" if folder else None
    try:
        return path, json.loads(path.read_text()) if path and path.exists() else {}
    except (OSError, ValueError):
        return path, {}  # unreadable: time it again and write it afresh
