"""GPT-2 in JAX: the forward pass, with a tiny explicit KV cache.

Params are a plain pytree named after the checkpoint's own tensors (`h[3]["attn"]["c_attn"]["weight"]`
is `h.3.attn.c_attn.weight`). Dense weights are kept as [out, in], like `torch.nn.Linear` and the
token embedding, so every product is `x @ w.T`; GPT-2's checkpoints store them [in, out] (its
Conv1D), and the loader transposes them once.

Notation: T = tokens fed in this call, S = the cache's capacity, C = n_embd, H = n_head,
D = C // H, V = vocab_size.

The cache is fixed buffers plus a length. A call writes its T keys/values at [length, length + T)
with `lax.dynamic_update_slice` and returns length + T. Rolling back is setting the length back:
slots at or beyond the length are stale, and the causal mask never lets a query see them.
"""

from dataclasses import dataclass
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class GPT2Config:
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block (gpt2-xl has 25: nothing assumes a power of two)
    n_embd: int = 768  # C, the residual width; each head has C // n_head channels
    n_positions: int = 1024  # context length: rows of wpe, and the most a cache can hold
    vocab_size: int = 50257  # rows of wte, which doubles as the (tied) LM head
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int | None = 50256  # <|endoftext|>; None if the checkpoint does not say

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def precision(dtype):
    """float32 products in full float32. Left to the default, a GPU multiplies float32 in TF32 and a
    TPU in bfloat16 passes: p and q would shift, and greedy ties could break differently."""
    return jax.lax.Precision.HIGHEST if dtype == jnp.float32 else jax.lax.Precision.DEFAULT


def matmul(x, w):  # [T, in], [out, in] -> [T, out]: x @ w.T, summed in float32 whatever the dtype
    return jnp.matmul(x.astype(w.dtype), w.T, precision=precision(w.dtype),
                      preferred_element_type=jnp.float32).astype(x.dtype)


@partial(jax.tree_util.register_dataclass, data_fields=["params"], meta_fields=["config", "matmul"])
@dataclass(frozen=True)
class Model:
    config: GPT2Config  # static: part of what jit compiles for
    params: dict  # the checkpoint's tensors, as jax arrays
    matmul: Callable = matmul  # static: how x @ w.T is computed (load_model picks picospec.fastpath's)


class KVCache(NamedTuple):
    k: list  # n_layer x [H, S, D]: each layer's keys per head, slot s holding position s
    v: list  # n_layer x [H, S, D]: values
    length: jax.Array  # int32 []: slots [0, length) are valid, the rest are stale


def init_cache(config: GPT2Config, max_len: int | None = None, dtype=jnp.float32) -> KVCache:
    """An empty cache holding up to `max_len` (default n_positions) positions."""
    shape = (config.n_head, max_len or config.n_positions, config.head_dim)
    buffers = lambda: [jnp.zeros(shape, dtype) for _ in range(config.n_layer)]  # noqa: E731
    return KVCache(buffers(), buffers(), jnp.array(0, jnp.int32))


def gelu(x):  # GPT-2's "gelu_new" is the tanh approximation
    return jax.nn.gelu(x, approximate=True)


def layer_norm(x, weight, bias, eps):  # [T, C], [C], [C] -> [T, C]
    x32 = x.astype(jnp.float32)  # statistics in float32, even for bfloat16 params
    mean = x32.mean(-1, keepdims=True)  # [T, 1]
    var = x32.var(-1, keepdims=True)  # [T, 1]
    return ((x32 - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype) * weight + bias


def attention(q, k, v, visible):  # [T, H, D], [H, S, D], [H, S, D], [T, S] -> [T, H, D]
    """Each of T queries attends to the S keys it may see. Scores and softmax in float32 whatever the
    dtype: a float16 q.k can pass float16's 65504."""
    scores = jnp.einsum("thd,hsd->hts", q, k, precision=precision(q.dtype),
                        preferred_element_type=jnp.float32) / jnp.sqrt(q.shape[-1])  # [H, T, S]
    weights = jax.nn.softmax(jnp.where(visible[None], scores, -jnp.inf), axis=-1).astype(q.dtype)  # [H, T, S]
    y = jnp.einsum("hts,hsd->htd", weights, v, precision=precision(v.dtype), preferred_element_type=jnp.float32)
    return y.astype(q.dtype).transpose(1, 0, 2)  # [H, T, D] -> [T, H, D]


def cached_attention(q, k, v, k_cache, v_cache, q_pos):
    """Write this call's keys and values k, v [H, T, D] into the layer's cache buffers [H, S, D] at
    positions q_pos [T], then attend over the buffers. Returns y [T, H, D] and the buffers."""
    k_cache = jax.lax.dynamic_update_slice(k_cache, k, (0, q_pos[0], 0))  # [H, S, D]
    v_cache = jax.lax.dynamic_update_slice(v_cache, v, (0, q_pos[0], 0))  # [H, S, D]
    # Slot s holds position s. A query sees positions up to its own: this is the causal mask, and it
    # also hides every stale slot, since those all lie beyond the newest position.
    visible = jnp.arange(k_cache.shape[1])[None, :] <= q_pos[:, None]  # [T, S]
    return attention(q, k_cache, v_cache, visible), k_cache, v_cache


def block(x, k_cache, v_cache, q_pos, ln_1, attn, ln_2, mlp, n_head, eps, matmul, attend):
    """One transformer block: x [T, C] at positions q_pos [T], with this layer's cache buffers
    k_cache, v_cache [H, S, D]. Returns x [T, C] and what `attend` returns for the cache."""
    T, C = x.shape
    linear = lambda x, weight, bias: matmul(x, weight) + bias  # noqa: E731  [T, in] -> [T, out]
    h = layer_norm(x, ln_1["weight"], ln_1["bias"], eps)  # [T, C]
    qkv = linear(h, **attn["c_attn"]).reshape(T, 3, n_head, C // n_head)  # [T, 3C] -> [T, 3, H, D]
    q = qkv[:, 0]  # [T, H, D]
    k, v = qkv[:, 1].transpose(1, 0, 2), qkv[:, 2].transpose(1, 0, 2)  # [H, T, D]: head-major, like the cache
    y, k_cache, v_cache = attend(q, k, v, k_cache, v_cache, q_pos)  # [T, H, D]
    x = x + linear(y.reshape(T, C), **attn["c_proj"])  # [T, C]
    h = layer_norm(x, ln_2["weight"], ln_2["bias"], eps)  # [T, C]
    x = x + linear(gelu(linear(h, **mlp["c_fc"])), **mlp["c_proj"])  # [T, C] -> [T, 4C] -> [T, C]
    return x, k_cache, v_cache


def transformer(model: Model, tokens, cache: KVCache, attend=cached_attention, positions=None):
    """tokens [T] at positions [cache.length, cache.length + T) -> logits [T, V], and what `attend`
    returns for each layer's cache: by default its buffers with these keys (n_layer x [H, S, D]) and
    values written. (positions [T]: others, for a tree's nodes, which sit at their depth: tree.py.)"""
    params, config = model.params, model.config
    q_pos = cache.length + jnp.arange(tokens.shape[0]) if positions is None else positions  # [T]
    # Gathers clamp out-of-range indices, so a padded position past the context stays harmless.
    x = params["wte"]["weight"][tokens] + params["wpe"]["weight"][q_pos]  # [T, C]
    k_all, v_all = [], []
    for layer, k_cache, v_cache in zip(params["h"], cache.k, cache.v):
        x, k, v = block(x, k_cache, v_cache, q_pos, **layer, n_head=config.n_head,
                        eps=config.layer_norm_epsilon, matmul=model.matmul, attend=attend)
        k_all.append(k)
        v_all.append(v)
    x = layer_norm(x, **params["ln_f"], eps=config.layer_norm_epsilon)  # [T, C]
    # The LM head is tied to the token embedding: [T, C] -> [T, V], in float32.
    return model.matmul(x.astype(jnp.float32), params["wte"]["weight"]), k_all, v_all


@partial(jax.jit, donate_argnames=("cache",))
def forward(model: Model, tokens, cache: KVCache):
    """Feed `tokens` after what `cache` holds.

    Args:
      model: the Model (its config is static: one compile per model shape).
      tokens: int32 [T], placed at positions [cache.length, cache.length + T).
      cache: KVCache; donated (updated in place), so do not reuse the one you pass in.
    Returns:
      logits: float32 [T, V], the next-token logits after each fed token.
      cache: the KVCache with these T positions written and length + T.
    The caller keeps cache.length + T <= S.
    """
    logits, k_all, v_all = transformer(model, tokens, cache)  # [T, V], n_layer x [H, S, D] each
    return logits, KVCache(k_all, v_all, cache.length + tokens.shape[0])


def init_params(config: GPT2Config, key: jax.Array, std: float = 0.02, dtype=jnp.float32) -> dict:
    """Random GPT-2 params (GPT-2's own init: N(0, std), residual projections scaled by depth)."""
    C, L = config.n_embd, config.n_layer
    keys = iter(jax.random.split(key, 2 + 4 * L))

    def dense(n_in, n_out, scale=1.0):  # [out, in], see the module docstring
        w = std * scale * jax.random.normal(next(keys), (n_out, n_in))
        return {"weight": w.astype(dtype), "bias": jnp.zeros(n_out, dtype)}

    def norm():
        return {"weight": jnp.ones(C, dtype), "bias": jnp.zeros(C, dtype)}

    proj_scale = (2 * L) ** -0.5
    return {
        "wte": {"weight": (std * jax.random.normal(next(keys), (config.vocab_size, C))).astype(dtype)},
        "wpe": {"weight": (std * jax.random.normal(next(keys), (config.n_positions, C))).astype(dtype)},
        "h": [
            {
                "ln_1": norm(),
                "attn": {"c_attn": dense(C, 3 * C), "c_proj": dense(C, C, proj_scale)},
                "ln_2": norm(),
                "mlp": {"c_fc": dense(C, 4 * C), "c_proj": dense(4 * C, C, proj_scale)},
            }
            for _ in range(L)
        ],
        "ln_f": norm(),
    }


def logits(model: Model, tokens) -> jax.Array:
    """A full forward pass over `tokens` [T] from an empty cache -> float32 logits [T, V]. For checks."""
    tokens = jnp.asarray(tokens, jnp.int32)
    cache = init_cache(model.config, len(tokens), model.params["wte"]["weight"].dtype)
    return forward(model, tokens, cache)[0]
