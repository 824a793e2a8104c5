"""picospec: speculative sampling on GPT-2, from scratch in JAX."""

from picospec.beyond.loop import Trace
from picospec.beyond.ngram import NGramDraft
from picospec.errors import PicospecError
from picospec.gpt2 import GPT2Config, KVCache, Model, forward, init_cache
from picospec.sampling import Sampling
from picospec.tools.checkpoints.head import load_head
from picospec.tools.checkpoints.weights import load_model, load_tokenizer
from picospec.tools.samplers import (
                                     autoregressive_sample,
                                     autoregressive_sample_batch,
                                     logits,
                                     speculative_sample,
                                     speculative_sample_batch,
)

__all__ = [
    "GPT2Config", "KVCache", "Model", "NGramDraft", "PicospecError", "Sampling", "Trace",
    "autoregressive_sample", "autoregressive_sample_batch", "forward", "init_cache", "load_head", "load_model",
    "load_tokenizer",
    "logits", "speculative_sample", "speculative_sample_batch",
]
