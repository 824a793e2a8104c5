"""Right on every platform: what an accelerator would compile, read on CPU from `jax.export` lowerings
(no device needed), and the dtypes where float16 or bfloat16 could go wrong."""

import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import random_model

import picospec
from picospec import fastpath
from picospec.gpt2 import forward, init_cache
from picospec.tools import memory, programs
from picospec.tools.checkpoints import weights
from picospec.tools.checkpoints.weights import load_tokenizer, save_checkpoint

ACCELERATORS = ("cuda", "tpu")


def lowered(model, platform: str) -> str:
    run = jax.jit(lambda model, tokens, cache: forward(model, tokens, cache))
    cache = init_cache(model.config, 16, model.params["wte"]["weight"].dtype)
    return jax.export.export(run, platforms=[platform])(model, jnp.zeros(5, jnp.int32), cache).mlir_module()


def dots(text: str) -> list[str]:
    return [line for line in text.splitlines() if "stablehlo.dot_general" in line]


def test_float32_products_are_compiled_in_full_float32_on_accelerators():
    """Left to the default, a GPU computes float32 dots in TF32 and a TPU in bfloat16 passes."""
    model = fastpath.fast(random_model(n_head=2, n_embd=32, vocab_size=40))
    for platform in ACCELERATORS:
        found = dots(lowered(model, platform))
        assert len(found) >= 2 * 4 + 2 + 1, platform  # per layer 4 weight products and 2 in attention; the head
        assert all("precision = [HIGHEST, HIGHEST]" in line for line in found), platform
    # The control: the lowering does show a dot's precision, and a default one has none.
    plain = jax.jit(lambda a, b: a @ b)
    text = jax.export.export(plain, platforms=["cuda"])(jnp.ones((2, 2)), jnp.ones((2, 2))).mlir_module()
    assert dots(text) and "HIGHEST" not in dots(text)[0]


def test_bfloat16_products_keep_the_fast_default_and_sum_in_float32():
    model = random_model(n_head=2, n_embd=32, vocab_size=40)
    model = picospec.Model(model.config, jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), model.params))
    for platform in ACCELERATORS:
        weight_products = [d for d in dots(lowered(model, platform)) if "xbf16>, tensor<" in d]
        assert weight_products and all("HIGHEST" not in d and d.endswith(re.findall(r"-> tensor<[^>]*f32>.*", d)[0])
                                       for d in weight_products), platform


def float16_checkpoint(tmp_path, scale: float):
    """A checkpoint stored in float16 whose first layer's queries and keys are `scale` times larger:
    its attention scores q.k reach past float16's largest value, 65504, while every other value fits."""
    model = random_model(n_head=2, n_embd=32, vocab_size=40, std=0.5)
    w = np.array(model.params["h"][0]["attn"]["c_attn"]["weight"])  # [3C, C]: q, k, v rows
    w[:64] *= scale
    params = {**model.params, "h": [{**model.params["h"][0], "attn": {**model.params["h"][0]["attn"],
              "c_attn": {**model.params["h"][0]["attn"]["c_attn"], "weight": jnp.asarray(w)}}}, *model.params["h"][1:]]}
    save_checkpoint(picospec.Model(model.config, params), load_tokenizer("tiny-target"), tmp_path, np.float16)
    return tmp_path


def test_a_float16_checkpoint_whose_scores_overflow_float16_gives_the_float32_logits(tmp_path):
    folder = float16_checkpoint(tmp_path, scale=40.0)
    f16, f32 = picospec.load_model(str(folder), dtype="float16"), picospec.load_model(str(folder))
    assert f16.params["h"][0]["attn"]["c_attn"]["weight"].dtype == jnp.float16
    tokens = np.arange(20) % 40
    a, b = picospec.logits(f32, tokens), picospec.logits(f16, tokens)
    assert np.isfinite(b).all()
    assert np.abs(a - b).max() < 0.05 * np.abs(a).max()
    # The control: these scores, taken in float16 as the products' own dtype, overflow.
    layer = f16.params["h"][0]
    h = picospec.gpt2.layer_norm(f16.params["wte"]["weight"][tokens] + f16.params["wpe"]["weight"][:20],
                                 **layer["ln_1"], eps=1e-5)
    qkv = (h @ layer["attn"]["c_attn"]["weight"].T + layer["attn"]["c_attn"]["bias"]).reshape(20, 3, 2, 16)
    assert not np.isfinite(np.asarray(jnp.einsum("thd,shd->hts", qkv[:, 0], qkv[:, 1]))).all()


def test_sampling_compiles_to_no_loop_on_accelerators():
    """The inverse-CDF search is unrolled: a loop of 16 tiny steps would be 16 launches on a GPU."""
    from picospec.sampling import sample
    probs = jnp.full(50257, 1 / 50257)
    for platform in ACCELERATORS:
        text = jax.export.export(jax.jit(sample), platforms=[platform])(jax.random.key(0), probs).mlir_module()
        assert "stablehlo.while" not in text, platform
    # The control: jnp.searchsorted's default method is such a loop.
    default = jax.jit(lambda cdf, u: jnp.searchsorted(cdf, u))
    assert "stablehlo.while" in jax.export.export(default, platforms=["cuda"])(probs, 0.5).mlir_module()


def test_the_cli_builds_its_programs_for_the_device_chosen_not_for_the_default_backend(monkeypatch):
    """`--platform cpu` on a GPU machine makes the CPU JAX's default device while the default backend
    stays the GPU: the CLI's programs must be exported, named and loaded for the device chosen. Read on
    CPU through a stand-in chosen device whose platform is cuda (exporting for it needs no GPU)."""
    with jax.default_device(jax.devices("cpu")[0]):
        assert memory.run_device() == jax.devices("cpu")[0]
    fn, args = programs.function("picospec.beyond.adaptive:own"), (jnp.zeros(3),)
    on_cpu = programs.digest(fn, args, {}, ())
    assert programs.exported(fn, args, {}).platforms == ("cpu",)
    monkeypatch.setattr(programs, "run_device", lambda: SimpleNamespace(platform="cuda", device_kind="H100"))
    assert programs.exported(fn, args, {}).platforms == ("cuda",)  # the default backend would give cpu
    assert programs.digest(fn, args, {}, ()) != on_cpu  # and another file


def test_a_model_loads_in_its_platforms_dtype_when_none_is_asked(monkeypatch):
    """float32 on a CPU; bfloat16 on a GPU or TPU (launch-bound there: fastpath.default_dtype), its logits
    float32 all the same; an explicit dtype wins (the CLI's JSON names its dtype: test_cli.py)."""
    assert fastpath.default_dtype("cpu") == "float32"
    assert fastpath.default_dtype("gpu") == fastpath.default_dtype("tpu") == "bfloat16"
    on_cpu = picospec.load_model("tiny-target")
    assert on_cpu.params["wte"]["weight"].dtype == jnp.float32
    monkeypatch.setattr(weights, "run_device", lambda: SimpleNamespace(platform="gpu"))  # as if on a GPU
    on_gpu = picospec.load_model("tiny-target")
    assert on_gpu.params["h"][0]["attn"]["c_attn"]["weight"].dtype == jnp.bfloat16
    assert picospec.logits(on_gpu, [1, 2, 3]).dtype == jnp.float32
    assert picospec.load_model("tiny-target", "float32").params["wte"]["weight"].dtype == jnp.float32


@pytest.mark.parametrize("Ks", [(4,), pytest.param((2, 6), marks=pytest.mark.slow)])
def test_greedy_speculative_is_greedy_autoregressive_in_the_gpus_dtype(Ks):
    """The accelerators' default, bfloat16 weights with float32 logits, computed here on the CPU: greedy
    speculative output is greedy autoregressive output on the bundled pair (the target's argmax at every
    position, whether it scored 1 or K + 1 tokens in the call), at K = 4 on three prompts (-m slow: K = 2, 6)."""
    draft, target = (picospec.load_model(name, "bfloat16") for name in ("tiny-draft", "tiny-target"))
    tokenizer = picospec.load_tokenizer("tiny-target")
    for text in ("And God said", "In the beginning", "And the LORD spake unto Moses"):
        prompt = tokenizer.encode(text).ids
        greedy = picospec.autoregressive_sample(target, prompt, 48, jax.random.key(0), temperature=0)
        for K in Ks:
            out, trace = picospec.speculative_sample(draft, target, prompt, 48, jax.random.key(0), K=K, temperature=0)
            np.testing.assert_array_equal(out, greedy, err_msg=f"{text!r} K={K}")
            assert int(trace.n_accepted[:int(trace.n_steps)].sum()) > 0  # drafts were kept, not the target alone
