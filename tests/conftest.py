import dataclasses
import os
from importlib.metadata import version

# No test reaches the network: the hub client must answer from its cache or fail fast.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The CLI keeps compiled programs on disk; here that would hide the recompiles the compile counters
# look for (test_jit_cache.py turns it on where it is the subject).
os.environ["PICOSPEC_JIT_CACHE"] = "off"
# The test models are tiny: they spend most of their time compiling and little running, so the suite
# compiles without XLA's backend optimizations and with XLA:CPU's older, quicker code generator for
# fused operations (the fast suite on 2 cores: 345 s with the first alone, 214 s with both), without
# LLVM's expensive passes, and in one piece, not split for threads the test processes do not have
# (the zoo and adaptive-K tests: 72 s of CPU against 98 s). PICOSPEC_TEST_XLA_OPT=1 keeps XLA's defaults,
# to run the suite on the build users get. XLA aborts the process, silently, at a flag it does not know:
# jaxlib 0.11 dropped the older code generator's switch, and the others were measured on jaxlib 0.10.
if not os.environ.get("PICOSPEC_TEST_XLA_OPT"):
    quick = "--xla_backend_optimization_level=0"
    if tuple(int(part) for part in version("jaxlib").split(".")[:2]) < (0, 11):
        quick += (" --xla_cpu_use_fusion_emitters=false --xla_llvm_disable_expensive_passes=true"
                  " --xla_cpu_parallel_codegen_split_count=1")
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {quick}".strip()

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import pytest  # noqa: E402
from jax.experimental.compilation_cache import compilation_cache  # noqa: E402

from picospec.gpt2 import GPT2Config, Model, init_params  # noqa: E402
from picospec.tools import jit_cache  # noqa: E402

DATA = Path(__file__).parent / "data"
sys.path.append(str(Path(__file__).parents[1] / "benchmarks"))  # the benchmarks' scripts, which tests run
# The device the tests run on, as the CLI's summary and the benchmark's report name it.
DEVICE = f"{jax.devices()[0].device_kind} ({jax.devices()[0].platform})"


def random_model(seed=0, n_layer=2, n_head=2, n_embd=16, vocab_size=8, n_positions=64, std=0.5):
    """A small random GPT-2 whose next-token distributions are far from uniform."""
    config = GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=n_positions,
                        vocab_size=vocab_size, eos_token_id=vocab_size - 1)
    return Model(config, init_params(config, jax.random.key(seed), std=std))


def early_exit(model: Model, n_layer: int) -> Model:
    """The model's first n_layer blocks with its embeddings and final norm: a draft that agrees with
    its target part of the time, as a real draft does (two unrelated random models almost never do)."""
    return dataclasses.replace(model, config=dataclasses.replace(model.config, n_layer=n_layer),
                               params={**model.params, "h": model.params["h"][:n_layer]})


class CompileCounter:
    """Counts XLA compilations while active (jax reports each backend compile as an event)."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._listen)

    def _listen(self, event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


_counter = None


@pytest.fixture
def compiles():
    global _counter
    _counter = _counter or CompileCounter()
    return _counter


@pytest.fixture(autouse=True)
def no_persistent_cache_after_the_test():
    """A test that runs the CLI with a cache folder turns JAX's persistent cache on for the whole process
    (jit_cache.use_persistent_cache): turn it back off, so that no later test writes every program it
    compiles into that folder."""
    before = {name: getattr(jax.config, name) for name in jit_cache.settings(Path())}
    yield
    if any(getattr(jax.config, name) != value for name, value in before.items()):
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()  # JAX decides once whether to use it: let it decide again
