"""The cost of more rows through 12 layers of GPT-2 1558M-shaped float32 products, JAX against torch.

    python benchmarks/rows_chain.py            # picospec's gpt2.matmul (weight as the left operand)
    python benchmarks/rows_chain.py --torch    # torch.nn.functional.linear, the same shapes

Run each in a process of its own (the two libraries' thread pools fight in one). For each row count
the chain's fastest of 5 interleaved rounds, its ratio to one row, and the FLOP rate it reached.
"""

import sys

from picospec.tools.timing import race

C, LAYERS, ROWS = 1600, 12, [1, 2, 4, 5, 8, 9, 16]
SHAPES = [(3 * C, C), (C, C), (4 * C, C), (C, 4 * C)]  # [out, in]: c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj


def chain_jax():
    import jax
    import jax.numpy as jnp

    from picospec.gpt2 import matmul
    key = jax.random.key(0)
    weights = [0.02 * jax.random.normal(jax.random.fold_in(key, i), s) for i, s in enumerate(SHAPES * LAYERS)]

    @jax.jit
    def run(weights, x):  # x [T, C]; each product's output feeds the next product of its width
        h = {C: x, 4 * C: jnp.tile(x, (1, 4))}
        for w in weights:
            h[w.shape[0]] = matmul(h[w.shape[1]], w)
            if w.shape[0] == 3 * C:  # fold c_attn's output in: a product nothing reads is compiled away
                h[C] = h[C] + h[3 * C].reshape(-1, 3, C).sum(1)
        return h[C]
    inputs = {T: jax.random.normal(key, (T, C)) for T in ROWS}
    return sum(w.size for w in weights), lambda T: run(weights, inputs[T]).block_until_ready()


def chain_torch():
    import torch
    torch.manual_seed(0)
    weights = [0.02 * torch.randn(*s) for s in SHAPES * LAYERS]
    inputs = {T: torch.randn(T, C) for T in ROWS}

    def run(T):
        with torch.inference_mode():
            h = {C: inputs[T], 4 * C: inputs[T].repeat(1, 4)}
            for w in weights:
                h[w.shape[0]] = torch.nn.functional.linear(h[w.shape[1]], w)
                if w.shape[0] == 3 * C:  # the same sum as the JAX chain's
                    h[C] = h[C] + h[3 * C].reshape(-1, 3, C).sum(1)
    return sum(w.numel() for w in weights), run


def main():
    library = "torch" if "--torch" in sys.argv else "jax"
    n_weights, run = chain_torch() if library == "torch" else chain_jax()
    seconds, _ = race(5, **{f"{T} rows": lambda T=T: run(T) for T in ROWS})  # warm-up, then 5 rounds in turn
    best = {T: seconds[f"{T} rows"] for T in ROWS}
    print(f"{library}: 12 layers of 1558M-shaped float32 products, {n_weights * 4 / 1e9:.2f} GB")
    for T in ROWS:
        print(f"  {T:2d} rows: {best[T] * 1e3:6.1f} ms, {best[T] / best[1]:.2f}x one row, "
              f"{2 * T * n_weights / best[T] / 1e9:4.0f} GFLOP/s")


if __name__ == "__main__":
    main()
