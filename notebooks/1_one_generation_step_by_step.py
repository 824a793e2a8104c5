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
# # One generation, step by step
#
# The draft proposes K tokens d_0 … d_{K−1} (0-based, as in `speculative.py`), each sampled from its
# distribution **p**; the target scores all of them in one forward call, giving **q** at each position.
# d_i is **accepted** if the uniform **u_i < q(d_i) / p(d_i)** (so with probability min(1, q/p)). At the
# first rejection the target **resamples** from norm(max(0, q − p)) and the later drafts are **dropped**;
# if all K are accepted, the target adds a **bonus** token from its next distribution.
#
# The picture below is one generation, every decision of it: a row per iteration (one target call),
# a column per draft position, then the token the target added. Under each judged draft a grey bar is
# min(1, q/p) and a black tick is u: the draft is kept when the tick lies inside the bar.

# %%
MODELS = "bundled"  # "bundled": the offline tiny pair; "gpt2": GPT-2 124M drafting for 1558M (hub or cache)
PROMPT, K, TEMPERATURE, N_TOKENS, SEED = "And God said unto Moses", 4, 1.0, 64, 0

import jax
from IPython.display import HTML, Image, display

import picospec
from picospec.tools.cli.picture import draw, png
from picospec.tools.cli.show import coloured_text, decisions, extra_kind
from picospec.tools.cli.steps import trace_steps

DRAFT, TARGET = {"bundled": ("tiny-draft", "tiny-target"), "gpt2": ("gpt2", "gpt2-xl")}[MODELS]
draft, target = picospec.load_model(DRAFT), picospec.load_model(TARGET)
tokenizer = picospec.load_tokenizer(TARGET)
prompt = tokenizer.encode(PROMPT).ids
tokens, trace = picospec.speculative_sample(draft, target, prompt, N_TOKENS, jax.random.key(SEED),
                                            K=K, temperature=TEMPERATURE)
steps = trace_steps(trace, N_TOKENS)
Image(png(draw(steps, tokenizer, K, f"{DRAFT} drafting for {TARGET}, K = {K}, temperature {TEMPERATURE}")))

# %% [markdown]
# The same text, each token coloured by how it came to be (accepted green, resample yellow, bonus blue),
# each rejected draft struck through in red before the token that replaced it:

# %%
display(HTML(coloured_text(steps, tokenizer, PROMPT)))

# %% [markdown]
# ## Three iterations in full
#
# A full accept (all K drafts pass, and the target adds a bonus token), an early rejection (d_0 fails,
# so the iteration yields only the resample), and a late rejection (d_0, d_1 pass, a later one fails).
# Each shows p(d_i), q(d_i), their ratio and the uniform u_i that decided.

# %%
def first(condition):
    return next((i for i, s in enumerate(steps) if condition(s)), None)

chosen = {"a full accept": first(lambda s: s.bonus),
          "an early rejection": first(lambda s: s.accepted == 0),
          "a late rejection": first(lambda s: K // 2 <= s.accepted < K)}
for what, i in chosen.items():
    if i is None:
        print(f"this run has no {what}: try another SEED")
        continue
    print(f"iteration {i}, {what}: {steps[i].accepted} of {K} accepted\n{decisions(steps[i], tokenizer)}\n")

# %% [markdown]
# ## Every iteration in one line

# %%
print("  i  accepted  extra     tokens added")
for i, s in enumerate(steps):
    print(f"{i:3d}  {s.accepted}/{K}       {extra_kind(s):8s}  {tokenizer.decode(s.tokens)!r}")
accepted = sum(s.accepted for s in steps)
print(f"\n{N_TOKENS} tokens in {len(steps)} target calls: {N_TOKENS / len(steps):.2f} tokens per call")
print(f"acceptance rate: {accepted} of {K * len(steps)} drafted tokens accepted ({accepted / (K * len(steps)):.0%})")
print(f"bonus tokens: {sum(s.bonus for s in steps)}, resamples: {sum(not s.bonus for s in steps)}")
assert sum(len(s.tokens) for s in steps) == N_TOKENS

# %% [markdown]
# ## At temperature 0 it is the target's greedy output
#
# With temperature 0 both p and q are one-hot, so a draft token is accepted exactly when it is the
# target's argmax, and a resample is the target's argmax. The result is the target's own greedy output.

# %%
greedy, trace0 = picospec.speculative_sample(draft, target, prompt, N_TOKENS, jax.random.key(0), K=K, temperature=0)
alone = picospec.autoregressive_sample(target, prompt, N_TOKENS, jax.random.key(0), temperature=0)
print(PROMPT + tokenizer.decode(greedy.tolist()))
print("identical to the target alone:", bool((greedy == alone).all()),
      f"| {N_TOKENS / int(trace0.n_steps):.2f} tokens per target call")

# %% [markdown]
# ## Exercises
#
# Predict first, then change the first code cell and run again.
# 1. K = 8: do tokens per call go up or down? And the acceptance rate (accepted / drafted)? Why can they move apart?
# 2. TEMPERATURE = 0: which verdicts can still occur? Why is every resample then the target's argmax?
# 3. TEMPERATURE = 2: the distributions flatten. Does the draft agree with the target more or less often?
# 4. Replace `draft` by `picospec.NGramDraft(3)` in the sampling call: what is p now, and what does a
#    rejection resample from?
