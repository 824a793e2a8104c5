"""The fast path: how `x @ w.T` is computed on each platform. The lesson does not need this file.

`gpt2.matmul` is the plain product, and it is what GPUs and TPUs compile: their compilers fuse the
bias and activation into it. XLA:CPU is different. It hands every product of two or more rows to its
GEMM library, which streams a large *left* operand well and a large right operand badly, so the CPU
formulation below puts the weight on the left (w @ x.T, then transposes back):

  GPT-2 1558M, float32, a target call of 5 tokens costs 1.45x one token this way, 2.82x plainly
  (4 tokens: 1.20x against 2.76x); 124M scores 5 tokens in 1.53x one token, against 2.14x.

Three details make it work. The library does 2, 4 and 8 rows in one pass but 5-7 in two, so rows are
padded to a power of two. XLA folds the transpose back into the slow orientation unless
`optimization_barrier`s stand between them. A lone float32 row keeps XLA's own matrix-vector loop
(at the memory roofline); bfloat16 has no fast one, so a lone bfloat16 row goes in padded to two.

`lax.platform_dependent` picks the branch when the program is lowered for a platform, so one jitted
function carries the CPU form on CPU and the plain form everywhere else (exported for "cuda" or "tpu",
it holds no barrier and no padding). `branch_on_cpu` is the same seam for the loop's run-time branches,
and `default_dtype` the platform's dtype when none is asked for.

platform_dependent traces every form it may lower. Code that knows the one platform it compiles for
(the CLI's programs, tools/programs.py) says so with `tracing_for`, and branch_on_cpu then traces only
that platform's form: the bundled pair's `--K auto` iteration traces and lowers in 3.4 s instead of 5.8 s
(a 2-core Xeon). Only there: JAX keeps an inner jitted function's trace for later calls whatever the platform,
so what it traces holds no jitted function that branches (gpt2.forward does not).
"""

import contextlib
import contextvars

import jax
import jax.numpy as jnp

from picospec import gpt2


def cpu_matmul(x, w):  # [T, in], [out, in] -> [T, out], summed in float32 whatever w's dtype
    T = x.shape[0]
    rows = max(1 << (T - 1).bit_length(), 1 if w.dtype == jnp.float32 else 2)  # 1, 2, 4, 8, 16...
    x_padded = jax.lax.optimization_barrier(jnp.pad(x.astype(w.dtype), ((0, rows - T), (0, 0))))  # [rows, in]
    y = jax.lax.dot_general(w, x_padded, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    y = jax.lax.optimization_barrier(y)  # [out, rows]
    return y.T[:T].astype(x.dtype)  # [T, out]


def matmul(x, w):  # [T, in], [out, in] -> [T, out]: the CPU form on CPU, gpt2.matmul elsewhere
    return jax.lax.platform_dependent(x, w, cpu=cpu_matmul, default=gpt2.matmul)


TRACING_FOR = contextvars.ContextVar("TRACING_FOR", default=None)  # the one platform being traced for, if known


@contextlib.contextmanager
def tracing_for(platform: str):
    """Within: branch_on_cpu traces only the form for `platform` (jax.export's name: "cpu", "cuda"...)."""
    token = TRACING_FOR.set(platform)
    try:
        yield
    finally:
        TRACING_FOR.reset(token)


def branch_on_cpu(cpu, elsewhere, *args):
    """cpu(*args) on the CPU, elsewhere(*args) on GPUs and TPUs (the same result). XLA:CPU runs a branch
    whose index is computed at run time (lax.cond, lax.switch) in place; XLA:GPU copies the index to the
    host and waits, which drains its queue of kernel launches. So where a step branches to skip work, the
    accelerators' form does that work branch-free (tests/round_trips.py counts what is left)."""
    platform = TRACING_FOR.get()
    if platform is not None:
        return (cpu if platform == "cpu" else elsewhere)(*args)
    return jax.lax.platform_dependent(*args, cpu=cpu, default=elsewhere)


def default_dtype(platform: str) -> str:
    """The dtype a model loads in when none is asked for. On a GPU a call is launch-bound, so float32's
    full-precision products buy nothing but cost when several tokens are scored: on an H200 a 1600-wide,
    8-layer call of T tokens over one token, T = 2, 5, 9, is 1.58, 1.76, 2.12 in float32 and 0.99, 0.92,
    0.94 in bfloat16, at the same time for one token (0.589 against 0.575 ms). bfloat16 weights and
    activations with float32 logits and probabilities, as serving stacks decode. On a CPU bfloat16 has no
    fast one-row product (GPT-2 1558M: 317 against 241 ms a token): float32 stays."""
    return "float32" if platform == "cpu" else "bfloat16"


def fast(model: gpt2.Model) -> gpt2.Model:
    """The same model, computing its products with the fast path."""
    return gpt2.Model(model.config, model.params, matmul)
