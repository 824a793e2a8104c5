"""How fast one-row products read GPT-2 1558M-shaped weights, against the benchmark's 1 GiB probe.

    python benchmarks/matvec_shapes.py

24 float32 matrices of 6400 x 1600 (0.98 GB, the MLP's c_fc shape; rows of 6.4 KB) multiplied by one
vector in one compiled program, written as gpt2.matmul writes a lone row (a [1, in] operand) and as
`w @ x`; the same matrices stacked into one; and the benchmark's bandwidth probe, one 16384 x 16384
matrix (rows of 64 KB). Raced in turn, fastest of 5.
"""

import jax
import jax.numpy as jnp

from picospec.tools.timing import race, stream_1GiB


def main():
    key = jax.random.key(0)
    weights = [jax.random.normal(jax.random.fold_in(key, i), (6400, 1600)) for i in range(24)]
    stacked = jnp.concatenate(weights)
    x = jax.random.normal(key, (1600,))

    @jax.jit
    def as_gpt2_matmul(weights, x):  # [out, in] with [1, in], contracting in -> [out, 1]
        return sum(jax.lax.dot_general(w, x[None], (((1,), (1,)), ((), ())))[0, 0] for w in weights)

    @jax.jit
    def as_matvec(weights, x):
        return sum((w @ x)[0] for w in weights)

    one_matvec = jax.jit(lambda w, x: (w @ x)[0])
    runs = {"gpt2.matmul's lone row": lambda: as_gpt2_matmul(weights, x).block_until_ready(),
            "w @ x": lambda: as_matvec(weights, x).block_until_ready(),
            "one stacked matrix": lambda: one_matvec(stacked, x).block_until_ready(),
            "the 1 GiB probe": stream_1GiB()}
    seconds, _ = race(5, **runs)
    for name, s in seconds.items():
        gb = (1 << 30) / 1e9 if "probe" in name else stacked.nbytes / 1e9
        print(f"{name:24s} {s * 1e3:6.1f} ms  {gb / s:5.1f} GB/s")


if __name__ == "__main__":
    main()
