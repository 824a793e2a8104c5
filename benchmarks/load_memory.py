"""`python benchmarks/load_memory.py [MODEL ...]`: the peak resident memory of loading a checkpoint,
as a multiple of its weights' bytes, float32 and bfloat16, each in a fresh child process.

Loading must never hold a second full copy of the weights: the promise is a peak below 1.3x. The
default MODEL is a GPT-2 1558M-shaped checkpoint (6.2 GB of float32), written once with transformers
by the benchmark when the real one is not in the Hugging Face cache.
"""

import argparse
import subprocess
import sys

PEAK_SCRIPT = """
import sys, jax, jax.numpy as jnp
jnp.ones(1).block_until_ready()
import picospec
def status(field):  # bytes; VmHWM is this process's peak (ru_maxrss would include the parent's)
    line = next(l for l in open('/proc/self/status') if l.startswith(field + ':'))
    return int(line.split()[1]) * 1024
before = status('VmRSS')
model = picospec.load_model(sys.argv[1], dtype=sys.argv[2])
size = sum(x.nbytes for x in jax.tree_util.tree_leaves(model.params))
print((status('VmHWM') - before) / size, size)
"""


def peak_ratio(model: str, dtype: str) -> tuple[float, int]:
    """(peak resident memory while loading / the loaded weights' bytes, those bytes), in a child process."""
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, model, dtype], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    ratio, size = out.stdout.split()
    return float(ratio), int(size)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/load_memory.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="*", default=["gpt2-xl"])
    args = parser.parse_args(argv)
    from gpt2_shapes import (
        resolve,  # the real checkpoint if cached, else a random one of its shape
    )
    for name in args.models:
        folder, real = resolve(name)
        for dtype in ("float32", "bfloat16"):
            ratio, size = peak_ratio(folder, dtype)
            print(f"{name} ({'real' if real else 'random'} weights) {dtype}: {size / 1e9:.2f} GB of weights, "
                  f"peak {ratio:.2f}x while loading {'(under 1.3x)' if ratio < 1.3 else '(OVER 1.3x)'}", flush=True)


if __name__ == "__main__":
    main()
