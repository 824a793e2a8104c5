# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Losslessness: the proof, then the samples
#
# Speculative sampling promises that its output follows the target's distribution exactly, whatever the
# draft. At one position, a token x comes out either as an accepted draft or from the residual after a
# rejection:
#
#   P(x) = p(x)·min(1, q(x)/p(x)) + (1 − Σ_y min(p(y), q(y))) · max(0, q(x) − p(x)) / Σ_y max(0, q(y) − p(y))
#        = min(p(x), q(x)) + max(0, q(x) − p(x)) = q(x),
#
# because the rejection mass 1 − Σ_y min(p(y), q(y)) equals Σ_y max(0, q(y) − p(y)): p and q both sum to 1.
# Below, both terms are drawn at a real position of the bundled pair, one where the draft and the target
# disagree (α = Σ min(p, q) is printed below), then 10,000 samples are drawn.

# %%
MODELS = "bundled"  # "bundled": the offline tiny pair; "gpt2": GPT-2 124M drafting for 1558M (hub or cache)
DRAFT, TARGET = {"bundled": ("tiny-draft", "tiny-target"), "gpt2": ("gpt2", "gpt2-xl")}[MODELS]

import jax
import numpy as np

import picospec

draft, target = picospec.load_model(DRAFT), picospec.load_model(TARGET)
tokenizer = picospec.load_tokenizer(TARGET)
print(f"draft {DRAFT}: {draft.config.n_layer} layers x {draft.config.n_embd}; "
      f"target {TARGET}: {target.config.n_layer} layers x {target.config.n_embd}")

# %%
from picospec.beyond import theory
from picospec.sampling import Sampling, logits_to_probs

PROMPT, TOP_K = "Now therefore let Pharaoh", 8  # a held-out verse's start, where p and q disagree
prompt = tokenizer.encode(PROMPT).ids
s = Sampling(1.0, TOP_K)
q = np.asarray(logits_to_probs(picospec.logits(target, prompt)[-1], s), np.float64)
p = np.asarray(logits_to_probs(picospec.logits(draft, prompt)[-1], s), np.float64)

accepted = np.minimum(p, q)  # P(the draft proposes x and it is accepted)
rejection_mass = 1 - accepted.sum()  # P(the draft token is rejected)
residual = np.maximum(q - p, 0) / np.maximum(q - p, 0).sum()  # what a rejection resamples from
law = accepted + rejection_mass * residual
print(f"α = Σ min(p, q) = {accepted.sum():.3f}; rejection mass {rejection_mass:.3f} = Σ max(0, q − p) = {np.maximum(q - p, 0).sum():.3f}")
print("largest |P(x) − q(x)|:", np.abs(law - q).max(), "| theory.lenient_output_law(p, q, 1) agrees:",
      bool(np.allclose(theory.lenient_output_law(p, q, 1.0), q)))

# %%
import matplotlib.pyplot as plt

plt.rcParams.update({"figure.dpi": 110, "legend.fontsize": 9})
support = np.flatnonzero((p > 0) | (q > 0))
x = np.arange(len(support))
plt.figure(figsize=(11, 4))
plt.bar(x - 0.3, p[support], 0.3, color="tab:gray", label="draft p")
plt.bar(x, accepted[support], 0.3, color="tab:green", label="min(p, q): accepted drafts")
plt.bar(x, (rejection_mass * residual)[support], 0.3, bottom=accepted[support], color="gold",
        label="rejection mass × residual: resamples")
plt.bar(x + 0.3, q[support], 0.3, color="tab:blue", label="target q")
plt.xticks(x, [repr(tokenizer.decode([t])) for t in support], rotation=45)
plt.xlabel("next token"); plt.ylabel("probability")
plt.title(f"next token after {PROMPT!r}, top-k={TOP_K}: the middle stacks sum to q")
plt.legend(loc="upper left", bbox_to_anchor=(1.01, 1)); plt.tight_layout(); plt.show()

# %% [markdown]
# ## 10,000 samples
#
# The first token after the same prompt, drawn 10,000 times by speculative sampling at once (`jax.vmap`
# over keys), beside q and p. The tests (tests/test_speculative.py) check the same for the joint law of
# three tokens, with chi-square tests and controls that a wrong sampler fails.

# %%
import os

from scipy.stats import chisquare

N = 500 if os.environ.get("PICOSPEC_NOTEBOOK_QUICK") else 10_000  # the test suite's smoke run draws fewer
keys = jax.random.split(jax.random.key(0), N)
first = jax.vmap(lambda k: picospec.speculative_sample(draft, target, prompt, 1, k, K=4, top_k=TOP_K)[0][0])(keys)
counts = np.bincount(np.asarray(first), minlength=q.size)
print("samples outside the target's support:", int(counts[q == 0].sum()))
expected_q = N * q[q > 0] / q[q > 0].sum()
print(f"chi-square against the target q: p-value {chisquare(counts[q > 0], expected_q, sum_check=False).pvalue:.3f}")
print(f"total variation between the samples and q: {0.5 * np.abs(counts / N - q).sum():.4f}, "
      f"between the samples and the draft's p: {0.5 * np.abs(counts / N - p).sum():.4f}")
plt.figure(figsize=(11, 4))
plt.bar(x - 0.27, p[support], 0.27, label="draft p", color="tab:gray")
plt.bar(x, q[support], 0.27, label="target q (exact)", color="tab:blue")
plt.bar(x + 0.27, counts[support] / N, 0.27, label=f"{N:,} speculative samples", color="tab:orange")
plt.xticks(x, [repr(tokenizer.decode([t])) for t in support], rotation=45)
plt.title(f"the first token after {PROMPT!r}: the samples follow q, not p")
plt.xlabel("next token"); plt.ylabel("probability (samples: frequency)")
plt.legend(loc="upper left", bbox_to_anchor=(1.01, 1)); plt.tight_layout(); plt.show()

# %% [markdown]
# ## Exercises
#
# 1. Replace the residual by q itself (resample from q after a rejection). Predict which tokens gain
#    probability, then recompute `law` and see.
# 2. Lenience (Leviathan et al., A.5): `theory.lenient_output_law(p, q, 0.5)`. How far is it from q, in
#    total variation? How much does α rise (`theory.lenient_alpha`)?
# 3. Pick a prompt where the draft is confident and wrong. What does the picture look like when
#    Σ min(p, q) is small?
