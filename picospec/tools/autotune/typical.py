"""What a pair's drafts are accepted at on text the target writes itself: where `--K auto`'s prior starts.

The drafts the loop judges follow the target's own text, and a draft agrees with that more often than
with a person's (on the bundled pair, greedy: 87% of drafts after the target's text, 79% after the
held-out verses'). A prompt is a few tokens of a person's text: alone, it is a prior weak and low enough
to stop a draft that would pay (a 3-word prompt, one of two positions accepted, stopped a draft that
would have finished 1.3x sooner by the timed costs). So the prior starts from the pair on the target's
own text: TEXTS texts that the target writes from the start of a document (greedy: one after each of its
TEXTS likeliest first tokens; sampled: as the run samples), each draft's chance of acceptance after
their TOKENS tokens past the first SKIP, beta = sum_x min(p(x), q(x)), averaged. A document's first
words are where both models know least, as a prompt's first position (autotune.prompt_prior), and the
loop's drafts follow a prompt, not a document's start: on the bundled pair, greedy, beta averages 0.75
over a text's first 8 tokens and 0.87 over the 32 after them, as after held-out verses (0.87).
Measured once for the pair and the sampling, and kept with the costs (jit_cache.remembered).
autotune.prompt_prior counts it as policy.ALIKE judged drafts: another text of the same two models,
alike but not the same.
"""

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from picospec.gpt2 import Model, logits
from picospec.sampling import Sampling, logits_to_probs
from picospec.tools.autotune.costs import describe
from picospec.tools.jit_cache import remembered
from picospec.tools.samplers import autoregressive_sample_batch

TEXTS, TOKENS, SKIP = 8, 32, 8  # the texts the target writes, their tokens weighed, and those before them
# left out (fewer of both where its context is shorter)


def alpha(draft: Model, target: Model, sampling: Sampling) -> float:
    """The pair's mean beta on the target's own text, sampled as `sampling` says; measured once."""
    how = f"T{sampling.temperature:g}:top_k{sampling.top_k}:top_p{sampling.top_p:g}"
    pair = f"{describe(draft)}:{weighs(draft)}:{describe(target)}:{weighs(target)}"
    key = f"alpha:{pair}:{how}:texts{TEXTS}x{TOKENS}after{SKIP}"
    return remembered(key, lambda: {"alpha": measure(draft, target, sampling)})["alpha"]


def weighs(model: Model) -> str:
    """A short digest of some of the model's weights (its shapes alone do not tell two checkpoints apart)."""
    params = model.params
    sample = [params["wte"]["weight"][:8], params["ln_f"]["weight"], params["h"][-1]["mlp"]["c_proj"]["bias"]]
    return hashlib.sha256(b"".join(np.asarray(x, np.float32).tobytes() for x in sample)).hexdigest()[:12]


def measure(draft: Model, target: Model, sampling: Sampling) -> float:
    eos = target.config.eos_token_id
    if sampling.greedy:  # greedy, one text a start: the document's likeliest first tokens
        first = np.argsort(-np.asarray(logits(target, [eos]))[-1])[:TEXTS]
        starts = [[eos, int(token)] for token in first]
    else:
        starts = [[eos]] * TEXTS
    n = min(SKIP + TOKENS, target.config.n_positions - len(starts[0]))
    keys = jax.random.split(jax.random.key(0), len(starts))
    written = autoregressive_sample_batch(target, starts, n, keys, temperature=sampling.temperature,
                                          top_k=sampling.top_k, top_p=sampling.top_p)
    texts = jnp.concatenate([jnp.int32(starts), written], axis=1)  # [TEXTS, S + n]
    skip = len(starts[0]) + min(SKIP, n // 2)  # the document's start, and its first words
    return float(beta(draft, target, texts, sampling)[:, skip:].mean())  # after the target's own tokens


@jax.jit
def beta(draft: Model, target: Model, texts, sampling: Sampling):
    """[TEXTS, L]: a draft's chance of acceptance after every prefix of texts [TEXTS, L]."""
    def laws(model):  # [TEXTS, L, V]
        return jax.vmap(lambda tokens: logits_to_probs(logits(model, tokens), sampling))(texts)
    return jnp.minimum(laws(draft), laws(target)).sum(-1)
