"""Many prompts at once: the single-prompt samplers, vmapped over rows.

Each row is its own sequence, with its own prompt length, key, sequence length n and cache lengths.
The row functions are exactly the ones `speculative_sample` and `autoregressive_sample` run; `jax.vmap`
batches them. A batched `lax.while_loop` runs until every row is finished and holds a finished row's
state unchanged (a select on the loop carry) while the others go on: rows accept different numbers of
drafts per iteration, reach n_tokens after different numbers of iterations, or stop at <|endoftext|>.

Written as a vmap, the batch is already "hand-batched" where it matters: every weight product of the
forward becomes one product over all B x T rows (one GEMM per weight, not B of them); the cache writes
become scatters, because each row writes at its own position, as a hand-batched forward with ragged
rows would have to do too.

So row b of the batch is `speculative_sample(draft, target, prompts[b], n_tokens, keys[b])`: the same
tokens and the same decisions; the recorded probabilities agree to float32 rounding (a batched product
may add in another order). Only the buffers are padded to the longest row; the padding is never read.
(picospec.tools.batches holds the entry points that check the inputs, memory and devices first.)
"""

from functools import partial

import jax
import numpy as np

from picospec.errors import PicospecError
from picospec.sampling import autoregressive_loop, buffers
from picospec.speculative import speculative_loop


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
def speculative_batch(draft, target, tokens, n_prompt, keys, n_tokens, K, sampling, prefill_len, max_len, eos_id):
    """speculative_loop for every row: tokens [B, L], n_prompt [B], keys [B] -> ([B, n_tokens], Trace [B, ...])."""
    row = partial(speculative_loop, draft, target, n_tokens=n_tokens, K=K, sampling=sampling,
                  prefill_len=prefill_len, max_len=max_len, eos_id=eos_id)
    return jax.vmap(row)(tokens, n_prompt, keys)


@partial(jax.jit, static_argnames=("n_tokens", "sampling", "prefill_len", "max_len", "eos_id"))
def autoregressive_batch(model, tokens, n_prompt, keys, n_tokens, sampling, prefill_len, max_len, eos_id):
    """autoregressive_loop for every row: tokens [B, L], n_prompt [B], keys [B] -> [B, n_tokens]."""
    row = partial(autoregressive_loop, model, n_tokens=n_tokens, sampling=sampling, prefill_len=prefill_len,
                  max_len=max_len, eos_id=eos_id)
    return jax.vmap(row)(tokens, n_prompt, keys)
