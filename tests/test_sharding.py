"""Several devices (CPU devices forced by XLA_FLAGS, in a subprocess): the same outputs as one device."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import jax, numpy as np
from conftest import early_exit, random_model
from picospec.tools.samplers import speculative_sample_batch
from picospec.tools.sharding import make_mesh, shard_model, shard_rows

target = random_model(seed=22, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
draft = early_exit(target, 1)
rng = np.random.default_rng(0)
rows = [[int(t) for t in rng.integers(0, 16, n)] for n in (1, 5, 17, 3, 30)]  # 5 rows: padded to the mesh
keys = jax.random.split(jax.random.key(3), len(rows))
report = {{"devices": len(jax.devices())}}
mesh = make_mesh(n_model=2)
tokens = shard_rows((np.zeros((5, 8), np.int32),), mesh)[0]
report["row_shard"] = list(tokens.addressable_shards[0].data.shape)  # 5 rows padded to the data axis, split
attn = shard_model(target, mesh).params["h"][0]["attn"]
report["c_attn_shard"] = list(attn["c_attn"]["weight"].addressable_shards[0].data.shape)  # [3C / 2, C]
report["c_proj_shard"] = list(attn["c_proj"]["weight"].addressable_shards[0].data.shape)  # [C, C / 2]
for T in (1.0,):  # sampled: a float that moved would move a token, so this is the stricter check
    one, _ = speculative_sample_batch(draft, target, rows, 24, keys, K=3, temperature=T)
    for n_model in {n_models}:
        mesh = make_mesh(n_model=n_model)
        out, trace = speculative_sample_batch(draft, target, rows, 24, keys, K=3, temperature=T, mesh=mesh)
        report[f"T={{T}} mesh={{dict(mesh.shape)}}"] = {{
            "speculative_same": bool((np.asarray(out) == np.asarray(one)).all()),
        }}
print(json.dumps(report))
"""


@pytest.mark.parametrize("n_devices", [pytest.param(n, marks=pytest.mark.slow) for n in (2, 4, 8)])
def test_sharded_batches_give_the_one_device_outputs(n_devices):
    tests = str(Path(__file__).parent)
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={n_devices}", "JAX_PLATFORMS": "cpu"}
    n_models = (2,) if n_devices == 2 else (1, 2)  # the fast case: data x model, the stricter of the two
    run = subprocess.run([sys.executable, "-c", SCRIPT.format(tests=tests, n_models=n_models)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.splitlines()[-1])
    assert report.pop("devices") == n_devices
    n_data = n_devices // 2  # on the data x model mesh
    assert report.pop("row_shard") == [-(-5 // n_data), 8]
    assert report.pop("c_attn_shard") == [24, 16] and report.pop("c_proj_shard") == [16, 8]
    assert len(report) == len(n_models)  # data parallel alone, and data x model (2-way tensor parallel)
    for name, result in report.items():
        assert result["speculative_same"], name
