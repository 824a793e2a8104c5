"""Every check of what a user asks for (draft_checks.py: what a draft is asked to do): the CLI and the public
entry points call these before anything runs, and the lesson assumes valid input, as picoGPT does. Each failure is
one PicospecError whose message says what is wrong and what to do (the CLI prints it and exits with 2)."""

import numbers

import jax
import jax.numpy as jnp

from picospec.errors import NonFiniteLogits, PicospecError
from picospec.gpt2 import Model
from picospec.sampling import Sampling


def whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def sampling(temperature=1.0, top_k=0, top_p=1.0) -> Sampling:
    """The Sampling these ask for, each number in one type, so that new values compile nothing."""
    if not temperature >= 0:
        raise PicospecError(f"temperature must be >= 0 (0 is greedy), got {temperature}")
    if not (whole(top_k) and top_k >= 0):
        raise PicospecError(f"top-k must be a whole number >= 0 (0 keeps all), got {top_k}")
    if not 0 < top_p <= 1:
        raise PicospecError(f"top-p must be in (0, 1] (1 keeps all), got {top_p}")
    return Sampling(float(temperature), int(top_k), float(top_p))


def positive(name: str, value: int):
    if not value >= 1:
        raise PicospecError(f"{name} must be >= 1, got {value}")


def prompt(tokens, n: int, lookahead: int, config):
    """A prompt of at least one token that fits the context with n tokens (and K drafts) after it."""
    positive("n-tokens", n)
    P = len(tokens)
    if P < 1:
        raise PicospecError("the prompt is empty: give at least one token (e.g. <|endoftext|>)")
    if P + n + lookahead - 1 > config.n_positions:
        extra = f" + K={lookahead}" if lookahead else ""
        raise PicospecError(f"prompt ({P} tokens) + n-tokens ({n}){extra} exceeds the model's "
                            f"context of {config.n_positions}; shorten the prompt or ask for fewer tokens")


def prompts(rows, n: int, lookahead: int, config):
    """`prompt` for each of a batch's prompts, naming the one at fault."""
    if len(rows) == 0:
        raise PicospecError("no prompts: give at least one")
    for b, tokens in enumerate(rows):
        try:
            prompt(tokens, n, lookahead, config)
        except PicospecError as e:
            raise PicospecError(f"prompt {b + 1} of {len(rows)}: {e}" if len(rows) > 1 else str(e)) from None


def eos(model: Model, stop_at_eos: bool) -> int:
    """The token id to stop at, or -1 (no token) when not stopping."""
    if stop_at_eos and model.config.eos_token_id is None:
        raise PicospecError("stop_at_eos needs the model's eos_token_id in its config.json")
    return model.config.eos_token_id if stop_at_eos else -1


def context(tokens, model: Model):
    """1 to n_positions tokens: past the context there is no position embedding."""
    if not 1 <= len(tokens) <= model.config.n_positions:
        raise PicospecError(f"logits takes 1 to {model.config.n_positions} tokens (the model's context), "
                            f"got {len(tokens)}")


def whole_positive(name: str, value):
    if not (whole(value) and value >= 1):
        raise PicospecError(f"{name} must be a whole number >= 1, got {value}")


def confidence(value: float):
    if not 0 <= value < 1:
        raise PicospecError(f"confidence must be in [0, 1), got {value}")


def plot(path: str | None, mode: str):
    """--plot draws speculative decisions, with matplotlib (the plot extra), into a PNG file."""
    if path is None:
        return
    if mode == "autoregressive":
        raise PicospecError("--plot draws the speculative run's decisions; use --mode speculative or compare")
    if not path.lower().endswith(".png"):
        raise PicospecError(f"--plot writes a PNG: give a file name ending in .png, not {path!r}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PicospecError('--plot needs matplotlib: pip install -e ".[plot]" (or leave --plot out)') from None


def keys(value, B: int):
    """One jax.random key per prompt."""
    value = jnp.asarray(value) if not isinstance(value, jax.Array) else value
    if not jnp.issubdtype(value.dtype, jax.dtypes.prng_key) or value.shape != (B,):
        raise PicospecError(f"give one jax.random key per prompt: {B} keys, e.g. jax.random.split(key, {B}); "
                            f"got {value.dtype} {tuple(value.shape)}")
    return value


def finite(trace, draft, target):
    """Refuse what a loop sampled if a model's logits held NaN or Inf (the trace's `finite` flags,
    read once, after the loop). Under an outer jax.jit they cannot be read: the trace carries them."""
    flags = [] if isinstance(trace.finite, jax.core.Tracer) else jnp.reshape(trace.finite, (-1, 2)).all(axis=0)
    for ok, which, model in zip(flags, ("draft", "target"), (draft, target)):
        if not ok:
            raise NonFiniteLogits(which, jax.tree.leaves(model.params)[0].dtype)
