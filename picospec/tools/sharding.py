"""Many devices: the batch's rows split across them, and optionally the target's weights.

JAX's SPMD partitioner does all the work: we only say where each array lives, as a NamedSharding over
a Mesh with two axes, and `jax.jit` compiles one program per device with the communication inserted.
No collective is written by hand; the samplers in picospec/beyond/batch.py are unchanged.

  "data"   data parallel: rows (token buffers, prompt lengths, keys) are split; weights are copied.
  "model"  tensor parallel (Megatron-LM's split of a block): c_attn and c_fc are split by output
           columns, each attention and MLP c_proj by input rows; everything else is copied.

On a CPU, XLA_FLAGS=--xla_force_host_platform_device_count=8 gives 8 devices to try this on.
"""

import dataclasses

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from picospec.errors import PicospecError
from picospec.gpt2 import Model


def make_mesh(n_data: int | None = None, n_model: int = 1) -> Mesh:
    """A (data, model) mesh over the first n_data * n_model devices; n_data defaults to all the rest."""
    devices = jax.devices()
    n_data = n_data or len(devices) // n_model
    if n_data < 1 or n_model < 1 or n_data * n_model > len(devices):
        raise PicospecError(f"a {n_data} x {n_model} mesh needs {n_data * n_model} devices; "
                            f"this machine has {len(devices)}")
    return Mesh(np.array(devices[:n_data * n_model]).reshape(n_data, n_model), ("data", "model"))


def weight_spec(path: tuple, x) -> P:
    """Where one tensor goes under tensor parallelism. Weights are [out, in] (see gpt2.py)."""
    names = [getattr(k, "key", None) for k in path]  # e.g. ["h", None, "attn", "c_attn", "weight"]
    if "c_attn" in names or "c_fc" in names:
        return P("model", None) if names[-1] == "weight" else P("model")  # output columns
    if "c_proj" in names and names[-1] == "weight":
        return P(None, "model")  # input rows; the partial sums are added across "model"
    return P()  # copied: embeddings, layer norms, c_proj's bias


def shard_model(model: Model, mesh: Mesh, tensor_parallel: bool = True) -> Model:
    """The model's params placed on the mesh: split over "model" (if tensor_parallel), else copied."""
    n_model = mesh.shape["model"]

    def place(path, x):
        spec = weight_spec(path, x) if tensor_parallel else P()
        if any(axis and x.shape[i] % n_model for i, axis in enumerate(spec)):
            spec = P()  # a dimension the model axis does not divide stays whole
        return jax.device_put(x, NamedSharding(mesh, spec))
    return dataclasses.replace(model, params=jax.tree_util.tree_map_with_path(place, model.params))


def shard_rows(arrays: tuple, mesh: Mesh) -> tuple:
    """Arrays with a leading batch axis [B, ...], split over "data". B is padded (repeating the last
    row) to a multiple of the data axis; the caller drops the padded rows' results."""
    pad = -arrays[0].shape[0] % mesh.shape["data"]  # rows that make B a multiple of the data axis
    split = NamedSharding(mesh, P("data"))
    return tuple(jax.device_put(jax.numpy.concatenate([x] + [x[-1:]] * pad) if pad else x, split) for x in arrays)


def place(mesh: Mesh, draft, target: Model, rows: tuple):
    """The draft copied to every device, the target split over "model", the rows split over "data"."""
    return jax.device_put(draft, NamedSharding(mesh, P())), shard_model(target, mesh), shard_rows(rows, mesh)
