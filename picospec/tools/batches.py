"""The batch samplers' entry points: check the inputs and the memory, place rows on devices, run
picospec.batch's vmapped loops."""

import jax
import jax.numpy as jnp

from picospec.batch import autoregressive_batch, batch_buffers, speculative_batch
from picospec.draft import as_draft, check_pair
from picospec.errors import PicospecError
from picospec.gpt2 import Model
from picospec.sampling import Sampling, eos_to_stop_at
from picospec.tools.memory import check_memory, memory_per_row
from picospec.tools.sharding import place


def speculative_sample_batch(draft, target: Model, prompts, n_tokens: int, keys, *, K=4, temperature=1.0,
                             top_k=0, top_p=1.0, stop_at_eos=False, verify="token", policy=None, drafts=1,
                             mesh=None):
    """`speculative_sample` for B prompts at once: prompts is a list of B token lists (any lengths),
    keys a [B] array of keys (e.g. jax.random.split(key, B)). Returns tokens int32 [B, n_tokens] and a
    Trace whose every field has a leading [B]; row b is exactly what the single-prompt call gives.
    policy, drafts: as for `speculative_sample`.
    mesh: a jax.sharding.Mesh (picospec.tools.sharding.make_mesh) to split the rows, and the target's
    weights, across devices."""
    sampling = Sampling(temperature, top_k, top_p)
    check_pair(draft, target, K, verify, drafts, policy)
    tokens, n_prompt, prefill_len, max_len = batch_buffers(prompts, n_tokens, K, target.config)
    models = [m for m in (draft, target) if isinstance(m, Model)]
    check_memory(drafts * len(prompts) * memory_per_row(models, max_len, K + 1), len(prompts))
    eos_id = eos_to_stop_at(target, stop_at_eos)
    args = (tokens, n_prompt, check_keys(keys, len(prompts)))
    draft = as_draft(draft, target)
    if mesh is not None:
        draft, target, args = place(mesh, draft, target, args)
    out, trace = speculative_batch(draft, target, *args, n_tokens, K, sampling, prefill_len, max_len, eos_id, verify,
                                    policy, drafts)
    return out[:len(prompts)], jax.tree_util.tree_map(lambda x: x[:len(prompts)], trace)


def autoregressive_sample_batch(model: Model, prompts, n_tokens: int, keys, *, temperature=1.0, top_k=0,
                                top_p=1.0, stop_at_eos=False, mesh=None):
    """`autoregressive_sample` for B prompts at once; returns int32 [B, n_tokens] (see above)."""
    sampling = Sampling(temperature, top_k, top_p)
    tokens, n_prompt, prefill_len, max_len = batch_buffers(prompts, n_tokens, 0, model.config)
    check_memory(len(prompts) * memory_per_row([model], max_len, 1), len(prompts))
    eos_id = eos_to_stop_at(model, stop_at_eos)
    args = (tokens, n_prompt, check_keys(keys, len(prompts)))
    if mesh is not None:
        _, model, args = place(mesh, None, model, args)
    out = autoregressive_batch(model, *args, n_tokens, sampling, prefill_len, max_len, eos_id)
    return out[:len(prompts)]


def check_keys(keys, B: int):
    """One jax.random key per prompt."""
    keys = jnp.asarray(keys) if not isinstance(keys, jax.Array) else keys
    if not jnp.issubdtype(keys.dtype, jax.dtypes.prng_key) or keys.shape != (B,):
        raise PicospecError(f"give one jax.random key per prompt: {B} keys, e.g. jax.random.split(key, {B}); "
                            f"got {keys.dtype} {tuple(keys.shape)}")
    return keys
