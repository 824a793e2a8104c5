"""GPT-2 in JAX: the forward pass, with a tiny explicit KV cache.

Params are a plain pytree named after the checkpoint's own tensors (`h[3]["attn"]["c_attn"]["weight"]`
is `h.3.attn.c_attn.weight`). The dense weights are kept as [out, in], like `torch.nn.Linear` and the
token embedding, so every matrix product contracts each weight row with the input: on CPU that is
the memory-friendly way round (a row is one contiguous read). GPT-2's checkpoints store them the
other way, [in, out] (its Conv1D); the loader transposes them once.

Notation: T = tokens fed in this call, S = the cache's capacity (max_len), C = n_embd,
H = n_head, D = C // H, V = vocab_size.

The cache is fixed buffers plus a length. A call writes its T keys/values at [length, length + T)
with `lax.dynamic_update_slice` and returns length + T. Rolling back is setting the length back:
slots at or beyond the length are stale, and the causal mask never lets a query see them.
"""

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from picospec.config import GPT2Config
from picospec.errors import PicospecError


@partial(jax.tree_util.register_dataclass, data_fields=["params"], meta_fields=["config"])
@dataclass(frozen=True)
class Model:
    config: GPT2Config  # static: part of what jit compiles for
    params: dict  # the checkpoint's tensors, as jax arrays


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


def matmul(x, w):  # [T, in], [out, in] -> [T, out], accumulated in float32 whatever w's dtype
    """x @ w.T written as w @ x.T: the weight is the product's LEFT operand.

    XLA:CPU hands every product of two or more rows to its GEMM library, which streams a large
    left operand well and a large right operand badly: with the weight on the left, GPT-2 1558M
    scores 5 tokens in 1.45x the time of one instead of 2.82x (4 tokens: 1.20x instead of 2.76x).
    The library does 2, 4 and 8 rows in one pass but 5-7 in two, so rows are padded to a power of
    two. A lone float32 row keeps XLA's own matrix-vector loop (at the memory roofline); bfloat16
    has no fast one (10x slower), so a lone bfloat16 row goes in padded to two. The barriers stop
    XLA folding the transpose back into the slow orientation.
    """
    T = x.shape[0]
    rows = max(1 << (T - 1).bit_length(), 1 if w.dtype == jnp.float32 else 2)  # 1, 2, 4, 8, 16...
    x_padded = jax.lax.optimization_barrier(jnp.pad(x.astype(w.dtype), ((0, rows - T), (0, 0))))  # [rows, in]
    y = jax.lax.dot_general(w, x_padded, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    y = jax.lax.optimization_barrier(y)  # [out, rows]
    return y.T[:T].astype(x.dtype)  # [T, out]


def linear(x, weight, bias):  # [T, in], [out, in], [out] -> [T, out]
    return matmul(x, weight) + bias


def attention(q, k, v, q_pos):  # [T, H, D], [H, S, D], [H, S, D], [T] -> [T, H, D]
    S, D = k.shape[1], k.shape[2]
    scores = jnp.einsum("thd,hsd->hts", q, k) / jnp.sqrt(D).astype(q.dtype)  # [H, T, S]
    # Slot s holds position s. A query sees positions up to its own: this is the causal mask,
    # and it also hides every stale slot, since those all lie beyond the newest position.
    visible = jnp.arange(S)[None, :] <= q_pos[:, None]  # [T, S]
    scores = jnp.where(visible, scores.astype(jnp.float32), -jnp.inf)  # [H, T, S]
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)  # [H, T, S]
    # [H, T, D] first: XLA emits "hts,hsd->thd" as a slow loop of its own for T >= 2, not a GEMM call.
    return jnp.einsum("hts,hsd->htd", weights, v).transpose(1, 0, 2)  # [H, T, D] -> [T, H, D]


def block(x, k_cache, v_cache, q_pos, ln_1, attn, ln_2, mlp, n_head, eps):
    """One transformer block: x [T, C] at positions q_pos [T], with this layer's cache buffers
    k_cache, v_cache [H, S, D]. Returns x [T, C] and the buffers with this call's keys/values written."""
    T, C = x.shape
    h = layer_norm(x, ln_1["weight"], ln_1["bias"], eps)  # [T, C]
    qkv = linear(h, **attn["c_attn"]).reshape(T, 3, n_head, C // n_head)  # [T, 3C] -> [T, 3, H, D]
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]  # [T, H, D] each
    # The cache is kept head-major, [H, S, D], so attention reads it in place.
    k_cache = jax.lax.dynamic_update_slice(k_cache, k.transpose(1, 0, 2), (0, q_pos[0], 0))  # [H, S, D]
    v_cache = jax.lax.dynamic_update_slice(v_cache, v.transpose(1, 0, 2), (0, q_pos[0], 0))  # [H, S, D]
    y = attention(q, k_cache, v_cache, q_pos).reshape(T, C)  # [T, H, D] -> [T, C]
    x = x + linear(y, **attn["c_proj"])  # [T, C]
    h = layer_norm(x, ln_2["weight"], ln_2["bias"], eps)  # [T, C]
    x = x + linear(gelu(linear(h, **mlp["c_fc"])), **mlp["c_proj"])  # [T, C] -> [T, 4C] -> [T, C]
    return x, k_cache, v_cache


def transformer(params, tokens, cache: KVCache, config: GPT2Config):
    """The trunk: tokens [T] at positions [cache.length, cache.length + T) -> hidden [T, C], cache."""
    q_pos = cache.length + jnp.arange(tokens.shape[0])  # [T]
    # Gathers clamp out-of-range indices, so a padded position past the context stays harmless.
    x = params["wte"]["weight"][tokens] + params["wpe"]["weight"][q_pos]  # [T, C]
    k_all, v_all = [], []
    for layer, k_cache, v_cache in zip(params["h"], cache.k, cache.v):
        x, k_cache, v_cache = block(x, k_cache, v_cache, q_pos, **layer, n_head=config.n_head,
                                   eps=config.layer_norm_epsilon)
        k_all.append(k_cache)
        v_all.append(v_cache)
    x = layer_norm(x, **params["ln_f"], eps=config.layer_norm_epsilon)  # [T, C]
    return x, KVCache(k_all, v_all, cache.length + tokens.shape[0])


def lm_head(params, x):  # [T, C] -> [T, V] float32; the head is tied to the token embedding
    return matmul(x.astype(jnp.float32), params["wte"]["weight"])


@partial(jax.jit, static_argnames=("config",), donate_argnames=("cache",))
def forward(params, tokens, cache: KVCache, config: GPT2Config):
    """Feed `tokens` after what `cache` holds.

    Args:
      params: the checkpoint's tensors (see module docstring).
      tokens: int32 [T], placed at positions [cache.length, cache.length + T).
      cache: KVCache; donated (updated in place), so do not reuse the one you pass in.
      config: the model's GPT2Config (static).
    Returns:
      logits: float32 [T, V], the next-token logits after each fed token.
      cache: the KVCache with these T positions written and length + T.
    The caller keeps cache.length + T <= S.
    """
    x, cache = transformer(params, tokens, cache, config)
    return lm_head(params, x), cache


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
    if not 1 <= len(tokens) <= model.config.n_positions:  # past it there is no position embedding
        raise PicospecError(f"logits takes 1 to {model.config.n_positions} tokens (the model's context), "
                            f"got {len(tokens)}")
    cache = init_cache(model.config, len(tokens), model.params["wte"]["weight"].dtype)
    return forward(model.params, tokens, cache, model.config)[0]
