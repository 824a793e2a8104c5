"""What XLA's flags do to compiling and running on a GPU: the CLI's first run on the bundled pair, one fresh
process for each set of flags, each with an empty cache folder.

    python benchmarks/gpu_flags.py                  # the sets below, about 2 minutes on one H200
    python benchmarks/gpu_flags.py --sets "; --xla_gpu_autotune_level=0"   # sets split at ";"

On a GPU most of a program's compile time can go to autotuning its products (XLA times several kernels
for each and keeps the fastest); the sets below leave that out in turn, and turn off command buffers
(CUDA graphs) as a control on the run time. Each row: the compile seconds the CLI reports, its wall
time, and its tokens/s at T = 0.8 (top-k 20, top-p 0.9), 200 tokens, K = 4, in the same process. XLA
ends a process at a flag it does not know: such a row says the run failed.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

FLAG_SETS = ["", "--xla_gpu_autotune_level=0", "--xla_gpu_enable_triton_gemm=false",
             "--xla_gpu_enable_command_buffer="]
RUN = ["--draft", "tiny-draft", "--target", "tiny-target", "--prompt", "And God said", "--n-tokens", "200",
       "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--K", "4", "--json"]


def first_run(flags: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        xla_flags = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
        env = {**os.environ, "PICOSPEC_JIT_CACHE": folder, "XLA_FLAGS": xla_flags}
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "picospec", *RUN], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if out.returncode:
        return dict(flags=flags, failed=(out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1])
    stats = json.loads(out.stdout)["stats"]
    return dict(flags=flags, compile_s=stats["compile_seconds"], wall_s=wall, tokens_per_s=stats["tokens_per_second"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", default=";".join(FLAG_SETS), help="XLA_FLAGS sets split at ';', a process each")
    args = parser.parse_args()
    print("| XLA_FLAGS | compile s | wall s | tokens/s |\n|---|---|---|---|", flush=True)
    for flags in (part.strip() for part in args.sets.split(";")):
        r = first_run(flags)
        print(f"| `{flags or '(none)'}` | " + (f"failed: {r['failed']} | | |" if "failed" in r else
                                              f"{r['compile_s']:.1f} | {r['wall_s']:.1f} | {r['tokens_per_s']:.0f} |"),
              flush=True)
