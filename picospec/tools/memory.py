"""Refusing, before anything is allocated, a batch whose buffers would not fit in memory."""

import jax

from picospec.errors import PicospecError


def memory_per_row(models, max_len: int, T: int) -> int:
    """Bytes one row needs while sampling: every model's KV cache (the bulk), and its logits and
    probabilities for T positions (a few copies alive at once)."""
    caches = sum(2 * m.config.n_layer * max_len * m.config.n_embd * m.params["wte"]["weight"].dtype.itemsize
                 for m in models)
    return caches + 8 * T * models[-1].config.vocab_size * 4


def available_memory() -> int:
    """Bytes this machine can still give (MemAvailable), or 0 if unknown."""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def check_memory(models, B: int, max_len: int, T: int, available: int | None = None):
    """Refuse a batch of B rows that would need more than 80% of the free memory."""
    available = available_memory() if available is None else available
    per_row = memory_per_row(models, max_len, T)
    need = B * per_row
    if jax.default_backend() == "cpu" and available and need > 0.8 * available:
        raise PicospecError(f"{B} prompts need about {need / 1e9:.1f} GB for their caches ({per_row / 1e6:.1f} MB "
                            f"a row) but {available / 1e9:.1f} GB is free; give at most "
                            f"{max(int(0.8 * available // per_row), 1)} prompts at once, or ask for fewer tokens")
