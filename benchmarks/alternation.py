"""Why the bundled pair's calls cost more alternating than apart: a cache effect, measured.

    python benchmarks/alternation.py

Times loops of forward calls (each call feeds the previous call's argmax; caches roll back), each
sequence run N times in one compiled loop and all sequences raced in turn (picospec.tools.timing.race):
4 one-token draft calls, one 5-token target call, both in turn (one K = 4 iteration's calls), and
controls: the draft with a draft call of 8 tokens (the GEMM library's path, no other weights), the
target with its own one-token calls (no other weights), and the target with a 4 x 64 random model
of the draft's vocabulary (0.6 MB of weights where the draft has 8.9 MB). "extra" is the sequence's
time in turn minus its parts' times apart.
"""

import jax
import jax.numpy as jnp

import picospec.gpt2 as gpt2
from picospec.config import GPT2Config
from picospec.tools.timing import race
from picospec.tools.weights import load_model

N = 100  # sequences per compiled loop


def loop(models: dict, sequence: tuple):
    """A function running `sequence` ((model name, T), ...) N times in one compiled loop."""
    @jax.jit
    def run(caches):
        def body(_, carry):
            token, caches = carry
            caches = dict(caches)
            for name, T in sequence:
                model = models[name]
                logits, cache = gpt2.forward(model.params, jnp.broadcast_to(token, (T,)), caches[name], model.config)
                caches[name] = cache._replace(length=cache.length - T)
                token = jnp.argmax(logits[-1]).astype(jnp.int32)
            return token, caches
        return jax.lax.fori_loop(0, N, body, (jnp.int32(0), caches))[0]

    caches = {name: gpt2.forward(models[name].params, jnp.zeros(32, jnp.int32),
                                 gpt2.init_cache(models[name].config, 128), models[name].config)[1]
              for name, _ in sequence}
    return lambda: run(caches).block_until_ready()


def main():
    draft, target = load_model("tiny-draft"), load_model("tiny-target")
    config = GPT2Config(n_layer=4, n_head=2, n_embd=64, n_positions=256, vocab_size=draft.config.vocab_size)
    models = {"draft": draft, "target": target, "4x64": gpt2.Model(config, gpt2.init_params(config, jax.random.key(0)))}
    sizes = {name: sum(x.nbytes for x in jax.tree_util.tree_leaves(m.params)) / 1e6 for name, m in models.items()}
    print("float32 weights: " + ", ".join(f"{name} {mb:.1f} MB" for name, mb in sizes.items()))
    parts = {"draft 1 x4": (("draft", 1),) * 4, "target 5": (("target", 5),), "draft 8": (("draft", 8),),
             "target 1 x4": (("target", 1),) * 4, "4x64 1 x4": (("4x64", 1),) * 4}
    pairs = {"draft 1 x4 + target 5": ("draft 1 x4", "target 5"),
             "draft 1 x4 + draft 8": ("draft 1 x4", "draft 8"),
             "target 1 x4 + target 5": ("target 1 x4", "target 5"),
             "4x64 1 x4 + target 5": ("4x64 1 x4", "target 5")}
    sequences = {**parts, **{name: parts[a] + parts[b] for name, (a, b) in pairs.items()}}
    seconds, _ = race(5, **{name: loop(models, s) for name, s in sequences.items()})
    ms = {name: s / N * 1e3 for name, s in seconds.items()}
    for name in parts:
        print(f"{name:24s} {ms[name]:7.3f} ms")
    for name, (a, b) in pairs.items():
        print(f"{name:24s} {ms[name]:7.3f} ms in turn, {ms[a] + ms[b]:7.3f} apart: extra {ms[name] - ms[a] - ms[b]:+.3f} ms")


if __name__ == "__main__":
    main()
