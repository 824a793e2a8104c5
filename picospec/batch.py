"""Many prompts at once: the single-prompt samplers, vmapped over rows.

Each row is its own sequence, with its own prompt length, key, sequence length n and cache lengths.
The row functions are exactly the ones `speculative_sample` and `autoregressive_sample` run; `jax.vmap`
batches them. A batched `lax.while_loop` runs until every row is finished and holds a finished row's
state unchanged (a select on the loop carry) while the others go on: rows accept different numbers of
drafts per iteration, reach n_tokens after different numbers of iterations, or stop at <|endoftext|>.

Written as a vmap, the batch is already "hand-batched" where it matters: every weight product of the
forward becomes one product over all B x T rows (one GEMM per weight in the jaxpr, not B of them); the
cache writes become scatters, because each row writes at its own position, as a hand-batched forward
with ragged rows would have to do too.

So row b of the batch is `speculative_sample(draft, target, prompts[b], n_tokens, keys[b])`: the same
tokens and the same decisions; the recorded probabilities agree to float32 rounding (a batched product
may add in another order). Only the buffers are padded to the longest row; the padding is never read.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from picospec.errors import PicospecError
from picospec.gpt2 import Model
from picospec.sampling import Sampling, _autoregressive, buffers, eos_to_stop_at
from picospec.speculative import _speculative, check_pair


def batch_buffers(prompts, n_tokens: int, lookahead: int, config) -> tuple[np.ndarray, np.ndarray, int, int]:
    """`sampling.buffers` for B prompts of different lengths: token buffers int32 [B, L] (row b holds
    prompt b), prompt lengths int32 [B], and the longest row's prefill length and cache capacity."""
    if len(prompts) == 0:
        raise PicospecError("no prompts: give at least one")
    rows = []
    for b, prompt in enumerate(prompts):
        try:
            rows.append(buffers(prompt, n_tokens, lookahead, config))
        except PicospecError as e:
            raise PicospecError(f"prompt {b + 1} of {len(prompts)}: {e}") from None
    L = max(len(tokens) for tokens, _, _ in rows)
    tokens = np.zeros((len(prompts), L), np.int32)  # [B, L]
    for b, (row, _, _) in enumerate(rows):
        tokens[b, :len(row)] = row
    n_prompt = np.array([len(p) for p in prompts], np.int32)  # [B]
    return tokens, n_prompt, max(r[1] for r in rows), max(r[2] for r in rows)


@partial(jax.jit, static_argnames=("n_tokens", "K", "sampling", "prefill_len", "max_len", "eos_id"))
def _speculative_batch(draft, target, tokens, n_prompt, keys, n_tokens, K, sampling, prefill_len, max_len,
                       eos_id):
    row = partial(_speculative, draft, target, n_tokens=n_tokens, K=K, sampling=sampling,
                  prefill_len=prefill_len, max_len=max_len, eos_id=eos_id)
    return jax.vmap(row)(tokens, n_prompt, keys)  # ([B, n_tokens], Trace with a leading [B])


@partial(jax.jit, static_argnames=("n_tokens", "sampling", "prefill_len", "max_len", "eos_id"))
def _autoregressive_batch(model, tokens, n_prompt, keys, n_tokens, sampling, prefill_len, max_len, eos_id):
    row = partial(_autoregressive, model, n_tokens=n_tokens, sampling=sampling, prefill_len=prefill_len,
                  max_len=max_len, eos_id=eos_id)
    return jax.vmap(row)(tokens, n_prompt, keys)  # [B, n_tokens]


def speculative_sample_batch(draft, target: Model, prompts, n_tokens: int, keys, *, K=4, temperature=1.0,
                             top_k=0, top_p=1.0, stop_at_eos=False, mesh=None):
    """`speculative_sample` for B prompts at once: prompts is a list of B token lists (any lengths),
    keys a [B] array of keys (e.g. jax.random.split(key, B)). Returns tokens int32 [B, n_tokens] and a
    Trace whose every field has a leading [B]; row b is exactly what the single-prompt call gives.
    mesh: a jax.sharding.Mesh (see picospec.sharding) to split the rows, and optionally the target's
    weights, across devices."""
    sampling = Sampling(temperature, top_k, top_p)
    check_pair(draft, target, K)
    tokens, n_prompt, prefill_len, max_len = batch_buffers(prompts, n_tokens, K, target.config)
    check_memory([m for m in (draft, target) if isinstance(m, Model)], len(prompts), max_len, K + 1)
    eos_id = eos_to_stop_at(target, stop_at_eos)
    keys = _check_keys(keys, len(prompts))
    args = (tokens, n_prompt, keys)
    if mesh is not None:
        from picospec.sharding import shard_model, shard_rows
        draft = shard_model(draft, mesh, tensor_parallel=False) if isinstance(draft, Model) else draft
        target, args = shard_model(target, mesh), shard_rows(args, mesh)
    out, trace = _speculative_batch(draft, target, *args, n_tokens, K, sampling, prefill_len, max_len, eos_id)
    return out[:len(prompts)], jax.tree_util.tree_map(lambda x: x[:len(prompts)], trace)


def autoregressive_sample_batch(model: Model, prompts, n_tokens: int, keys, *, temperature=1.0, top_k=0,
                                top_p=1.0, stop_at_eos=False, mesh=None):
    """`autoregressive_sample` for B prompts at once; returns int32 [B, n_tokens] (see above)."""
    sampling = Sampling(temperature, top_k, top_p)
    tokens, n_prompt, prefill_len, max_len = batch_buffers(prompts, n_tokens, 0, model.config)
    check_memory([model], len(prompts), max_len, 1)
    eos_id = eos_to_stop_at(model, stop_at_eos)
    args = (tokens, n_prompt, _check_keys(keys, len(prompts)))
    if mesh is not None:
        from picospec.sharding import shard_model, shard_rows
        model, args = shard_model(model, mesh), shard_rows(args, mesh)
    out = _autoregressive_batch(model, *args, n_tokens, sampling, prefill_len, max_len, eos_id)
    return out[:len(prompts)]


def _check_keys(keys, B: int):
    keys = jnp.asarray(keys) if not isinstance(keys, jax.Array) else keys
    if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) or keys.shape != (B,):
        raise PicospecError(f"give one jax.random key per prompt: {B} keys, e.g. jax.random.split(key, {B}); "
                            f"got {keys.dtype} {tuple(keys.shape)}")
    return keys


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
    """Refuse, before allocating anything, a batch whose buffers would not fit in memory."""
    available = available_memory() if available is None else available
    per_row = memory_per_row(models, max_len, T)
    need = B * per_row
    if jax.default_backend() == "cpu" and available and need > 0.8 * available:
        raise PicospecError(f"{B} prompts need about {need / 1e9:.1f} GB for their caches ({per_row / 1e6:.1f} MB "
                            f"a row) but {available / 1e9:.1f} GB is free; give at most "
                            f"{max(int(0.8 * available // per_row), 1)} prompts at once, or ask for fewer tokens")
