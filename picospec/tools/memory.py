"""Refusing, before anything is allocated, a batch whose buffers would not fit in the device's memory.

What is free is the device's own figure: its allocator's bytes_limit - bytes_in_use where reported (GPUs, TPUs), else on
a CPU the host's MemAvailable. What a run needs is read off the compiled programs (`memory_analysis`: the outputs and
scratch they allocate) where compiled ahead of time, as in the CLI's stream; the batch entry points, compiled on first
call, estimate it from the models' shapes (a test holds that against `memory_analysis`).
"""

from contextlib import suppress
from functools import lru_cache

import jax

from picospec.beyond.loop import empty_trace
from picospec.errors import PicospecError


def memory_per_row(models, max_len: int, T: int) -> int:
    """Bytes one row needs sampling: every model's KV cache (the bulk), twice (at its peak the compiled loop holds the
    prefilled caches and the loop's own), its logits and probabilities for T positions (a few copies alive at once), and
    what it returns: its tokens and its trace (room for an iteration per slot of the sequence, more than it can run)."""
    caches = 2 * sum(2 * m.config.n_layer * max_len * m.config.n_embd * m.params["wte"]["weight"].dtype.itemsize
                 for m in models)
    return caches + 8 * T * models[-1].config.vocab_size * 4 + 4 * max_len + trace_bytes(max_len, T - 1)


@lru_cache
def trace_bytes(R: int, K: int) -> int:  # a Trace of R iterations of K drafts (worked out once: eval_shape traces)
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(jax.eval_shape(lambda: empty_trace(R, K))))


def compiled_need(compiled) -> int:
    """Bytes a compiled program allocates when it runs: outputs and scratch (its inputs exist
    already), less the outputs written in place of donated inputs."""
    m = compiled.memory_analysis()
    return m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes


def run_device() -> jax.Device:
    """The device programs run on: the one chosen (JAX's default device, as --platform sets it), else JAX's first."""
    chosen = jax.config.jax_default_device
    return jax.devices(chosen)[0] if isinstance(chosen, str) else chosen or jax.devices()[0]


def available_memory(device=None) -> int:
    """Bytes `device` (default: the one programs run on) can still give, or 0 if unknown."""
    device = device or run_device()
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and "bytes_limit" in stats:
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    if device.platform != "cpu":
        return 0
    with suppress(OSError), open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def size(n_bytes: float) -> str:
    """Bytes as people read them: 1.2 GB, 350.0 MB, 19.5 kB, 800 bytes."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes:.0f} bytes"


def check_memory(need: int, B: int, available: int | None = None, device=None):
    """Refuse B rows needing `need` bytes in all, over 80% of what is free on `device` (default: run_device())."""
    device = device or run_device()
    available = available_memory(device) if available is None else available
    if available and need > 0.8 * available:
        per_row = need / B
        where = "host memory" if device.platform == "cpu" else f"{device.device_kind} memory"
        raise PicospecError(f"{B} prompts need about {size(need)} ({size(per_row)} a row) but "
                            f"{size(available)} of {where} is free; give at most "
                            f"{max(int(0.8 * available // per_row), 1)} prompts at once, or ask for fewer tokens")
