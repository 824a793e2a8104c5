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
# # Speed: what checking K drafts costs, and what it buys
#
# Each iteration of speculative sampling spends K draft calls and one target call that scores K + 1
# tokens, and keeps on average more than one token. Leviathan et al.'s walltime improvement, with the
# cost of that verification call written out:
#
#   speedup = (1 − α^(K+1)) / ((1 − α)(K·c + v(K)))
#
# - **α**: the probability that one drafted token is accepted (notebook 2);
# - **c**: one draft call's time over one target call's;
# - **v(K)**: the target's time to score K + 1 tokens in one call over its time for one token.
#
# The numerator is the expected tokens per target call, the denominator an iteration's cost counted
# in target calls. This notebook explains why v(K) can stay near 1 and measures it, with c, on the
# bundled pair; draws what the formula predicts; then counts α and races the samplers. Every printed
# number says what it is: a **measurement** (timed or counted here), a **prediction** (the formula
# fed with measurements, nothing adjusted), or a **fit** (a parameter chosen to match data).

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

# %% [markdown]
# ## Why K + 1 tokens can cost about as much as one
#
# Decoding one token multiplies a single row, [1, C], by every weight matrix of the model: one
# multiply and one add per weight, and each weight is read from memory once for them (4 bytes in
# float32). A processor can do many more operations in the time it takes to read 4 bytes, so a
# one-token call mostly waits for its weights to arrive: it is **memory-bound**, and its time is about
# the time to stream the weights.
#
# Scoring K + 1 tokens in one call multiplies [K + 1, C] by the same matrices. Each weight, once read,
# serves K + 1 rows: K + 1 times the arithmetic for the same bytes. While that arithmetic fits in
# the time the reading takes, the call costs what a one-token call costs and v(K) ≈ 1. Once K + 1
# approaches the machine's ratio of operations to bytes, compute catches up, and from there the time
# grows with the tokens, towards v(K) = K + 1 (as much as K + 1 separate calls). Verification is
# cheap because it uses the arithmetic a one-token call leaves idle. The target's own numbers:

# %%
import os

QUICK = bool(os.environ.get("PICOSPEC_NOTEBOOK_QUICK"))  # the test suite's smoke run: fewer points, same code

leaves = jax.tree_util.tree_leaves(target.params)
n_params, n_bytes = sum(x.size for x in leaves), sum(x.nbytes for x in leaves)
print(f"target: {n_params / 1e6:.1f} M weights, {n_bytes / 1e6:.0f} MB to read per call (counted)")
print(f"a call of T tokens: about 2·T·{n_params / 1e6:.1f} M operations, so {2 * n_params / n_bytes:.1f}·T operations "
      f"per byte read (counted from the shapes)")

# %% [markdown]
# ## Measuring c and v(K)
#
# `forward_times` (benchmarks/timing.py) times forward calls the benchmark's way: many calls in one
# compiled loop, so no Python dispatch is counted, and all of them raced in turn, so that a slow spell
# on a shared machine slows both sides of a ratio alike. Attention reads every slot of the cache, so
# the caches have the capacity the sampling runs below use.
#
# A straight line through the times, t(T) ≈ a + b·T, is a **fit** that splits a call into a part paid
# once per call (a: streaming the weights, and fixed overheads) and a part paid per token (b: the
# arithmetic). Then v(K) ≈ (a + b·(K + 1)) / (a + b): the smaller b is beside a, the flatter v.

# %%
import sys

import matplotlib.pyplot as plt

from picospec.autoregressive import buffers
from picospec.beyond import theory

sys.path.append("../benchmarks")  # the benchmarks' timing helpers
from timing import forward_times, race  # noqa: E402

plt.rcParams.update({"figure.dpi": 110, "legend.fontsize": 9})

PROMPT, TEMPERATURE = "And the LORD spake unto Moses, saying", 0.8
KS, N_TOKENS, SEEDS = ((2, 4), 32, 2) if QUICK else ((1, 2, 4, 8), 128, 4)  # the runs raced below
TS = (1, 3, 5) if QUICK else (1, 2, 3, 5, 9, 17, 33, 65)  # tokens per target call, K + 1: every K raced
prompt = tokenizer.encode(PROMPT).ids
capacity = buffers(prompt, N_TOKENS, max(KS), target.config)[2]  # the cache slots those runs use
t = forward_times({"draft 1": (draft, 1), **{f"target {T}": (target, T) for T in TS}}, capacity,
                  **(dict(min_seconds=0.02, rounds=1) if QUICK else {}))
c = t["draft 1"] / t["target 1"]
v = {T - 1: t[f"target {T}"] / t["target 1"] for T in TS}  # v(K) for K = T - 1
b, a = np.polyfit(TS, [t[f"target {T}"] for T in TS], 1)
v_fit = lambda K: (a + b * (K + 1)) / (a + b)  # noqa: E731

print(f"measured: one target call {t['target 1'] * 1e3:.2f} ms, one draft call {t['draft 1'] * 1e3:.3f} ms, "
      f"c = {c:.3f} (caches of {capacity} slots)")
print(" K   T   v(K) measured   v(K) fit")
for T in TS:
    print(f"{T - 1:2d} {T:3d} {v[T - 1]:15.2f} {v_fit(T - 1):10.2f}")
print(f"fit: a = {a * 1e3:.2f} ms per call, b = {b * 1e3:.3f} ms per token. Were a all weight reading "
      f"and b all arithmetic, the rates would be {n_bytes / a / 1e9:.0f} GB of weights/s and {2 * n_params / b / 1e9:.0f} G operations/s,")
print(f"  {2 * n_params * a / (n_bytes * b):.1f} operations per byte read; a call of T tokens does "
      f"{2 * n_params / n_bytes:.1f}·T, so compute catches up at T ≈ a / b = {a / b:.0f} tokens")

Tgrid = np.geomspace(1, max(TS), 50)
plt.figure(figsize=(7.5, 3.2))
plt.plot(TS, [v[T - 1] for T in TS], "o", label="measured")
plt.plot(Tgrid, v_fit(Tgrid - 1), "-", color="tab:blue", alpha=0.5, label="fit (a + b·T) / (a + b)")
plt.plot(Tgrid, Tgrid, ":", color="gray", label="K + 1: as many separate calls")
plt.axhline(1, color="gray", lw=0.8)
plt.title(f"v(K): the target's call of K + 1 tokens over its call of one ({TARGET})")
plt.xscale("log", base=2); plt.xlabel("T = K + 1 tokens scored in one call"); plt.ylabel("v(K)")
plt.ylim(0, max(v.values()) * 1.3); plt.legend(loc="upper left", bbox_to_anchor=(1.02, 1)); plt.tight_layout()
plt.show()

# %% [markdown]
# How flat v(K) is depends on the model and the machine: the ratio of the machine's arithmetic to
# its memory reads sets the T where compute catches up, and the fit reads that ratio off the
# measurement. A larger target, whose weights are too large for any cache and stream from main
# memory, and whose work is more nearly all matrix products, keeps v(K) near 1 for longer; in a tiny
# model the work that is not a weight read (attention over the cache, the layer norms, dispatching
# each operation) weighs more.
#
# ## What the formula predicts
#
# Left: the predicted speedup against K at the measured c, for a few α, with the fitted v(K)
# (solid) and with verification free, v = 1 as in the paper (dashed). The numerator,
# `theory.expected_tokens_per_call`, levels off towards 1 / (1 − α) as K grows, while the
# denominator K·c + v(K) keeps growing: hence a best K. Right: that best K (`theory.optimal_K`)
# against α, for the measured c and for a draft ten times cheaper.

# %%
Kgrid = np.arange(1, 17)
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
for alpha_, colour in [(0.6, "tab:red"), (0.8, "tab:blue"), (0.9, "tab:green")]:
    axes[0].plot(Kgrid, [theory.walltime_improvement(alpha_, K, c, v_fit(K)) for K in Kgrid], "-", color=colour,
                 label=f"α={alpha_}")
    axes[0].plot(Kgrid, [theory.walltime_improvement(alpha_, K, c, 1.0) for K in Kgrid], "--", color=colour)
axes[0].axhline(1, color="gray", lw=0.8)
axes[0].set(xlabel="K", ylabel=f"predicted speedup, c={c:.3f}",
            title="predicted speedup (solid: fitted v(K); dashed: v = 1)")
axes[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
grid = np.linspace(0.3, 0.95, 27)
for cost, style in [(c, "-"), (c / 10, "--")]:
    axes[1].plot(grid, [theory.optimal_K(x, cost, v_fit) for x in grid], style, color="tab:blue",
                 label=f"c={cost:.3f}, fitted v(K)")
    axes[1].plot(grid, [theory.optimal_K(x, cost) for x in grid], style, color="tab:orange", label=f"c={cost:.3f}, v=1")
axes[1].set(xlabel="α", ylabel="best K", title="the best K against α (theory.optimal_K)")
axes[1].legend(loc="upper left")
plt.tight_layout(); plt.show()

# %% [markdown]
# With v = 1 the best K grows quickly with α; a v(K) that rises makes every drafted token cost
# verification time too, and the best K stays smaller.
#
# ## A small race: prediction beside measurement
#
# α is counted from a few calibration runs at K = 4 (`theory.alpha_from_trace`), on other seeds than
# the raced runs, and used for every K: it is a property of the pair, the text and the temperature,
# not of K. Then `race` calls autoregressive sampling and speculative sampling at each K in turn,
# each generating the same SEEDS × N_TOKENS tokens, and keeps each one's fastest round (after a first
# call that compiles). The predictions use only the measured α, c and v(K).

# %%
calibration = [picospec.speculative_sample(draft, target, prompt, N_TOKENS, jax.random.key(100 + s), K=4,
                                           temperature=TEMPERATURE)[1] for s in range(2 * SEEDS)]
alpha = theory.alpha_from_trace(np.concatenate([np.asarray(tr.n_accepted[:int(tr.n_steps)]) for tr in calibration]), 4)
print(f"measured: α = {alpha:.3f}, from {2 * SEEDS} calibration runs at K = 4, temperature {TEMPERATURE}")

keys = [jax.random.key(seed) for seed in range(SEEDS)]


def timed(fn):  # one sampler's SEEDS runs, as one contender
    return lambda: [jax.block_until_ready(fn(k)) for k in keys]


runs = {"autoregressive": timed(lambda k: picospec.autoregressive_sample(
    target, prompt, N_TOKENS, k, temperature=TEMPERATURE))}
for K in KS:
    runs[f"K={K}"] = timed(lambda k, K=K: picospec.speculative_sample(
        draft, target, prompt, N_TOKENS, k, K=K, temperature=TEMPERATURE)[0])
seconds, _ = race(rounds=3, **runs)

rows = []
for K in KS:
    calls = sum(int(picospec.speculative_sample(draft, target, prompt, N_TOKENS, k, K=K,
                                                temperature=TEMPERATURE)[1].n_steps) for k in keys)
    rows.append(dict(K=K, calls=calls, tokens_per_call=SEEDS * N_TOKENS / calls,
                     tokens_per_call_predicted=float(theory.expected_tokens_per_call(alpha, K)),
                     speedup=seconds["autoregressive"] / seconds[f"K={K}"],
                     predicted=float(theory.walltime_improvement(alpha, K, c, v[K])),
                     predicted_v1=float(theory.walltime_improvement(alpha, K, c, 1.0))))
print(f"measured: autoregressive, {SEEDS * N_TOKENS / seconds['autoregressive']:.0f} tokens/s\n")
print("      tokens per call            speedup over autoregressive")
print(" K   measured  predicted    measured  predicted (α, c, v(K))  predicted (α, c, v = 1)")
for r in rows:
    print(f"{r['K']:2d} {r['tokens_per_call']:10.2f} {r['tokens_per_call_predicted']:10.2f} "
          f"{r['speedup']:10.2f}x {r['predicted']:18.2f}x {r['predicted_v1']:20.2f}x")

# %% [markdown]
# ## Where prediction and race differ
#
# The formula counts an iteration as K draft calls and one K + 1-token target call, each timed alone,
# and an autoregressive step as one target call. The race can be read in the same unit: each
# sampler's measured time per iteration (per token, for autoregressive sampling) over one bare
# target call. The difference is work the formula does not count: sampling from p and q, the accept
# test and its bookkeeping, the prompt's prefill, and the two models' calls taking turns, so that
# each may find the other's weights in the caches it would have used.

# %%
one = t["target 1"]
print(f"autoregressive step: {seconds['autoregressive'] / (SEEDS * N_TOKENS) / one:.2f} target calls measured, "
      "1 counted by the formula")
for r in rows:
    K = r["K"]
    print(f"iteration at K = {K}: {seconds[f'K={K}'] / r['calls'] / one:.2f} target calls measured, "
          f"K·c + v(K) = {K * c + v[K]:.2f} counted by the formula")

# %% [markdown]
# Both predictions are fit-free: where one misses, the lines above say how much of the time is not
# where the formula looks. Timings on a shared machine move between runs, so treat small row-to-row
# differences as noise; the same notebook in full mode (without PICOSPEC_NOTEBOOK_QUICK) draws more
# points and longer runs.
#
# ## Exercises
#
# Predict first, then run.
# 1. TEMPERATURE = 0: a draft is accepted exactly when it is the target's argmax. Does α rise or fall?
#    Which K does `theory.optimal_K(alpha, c, v_fit)` then pick, and does the race agree?
# 2. Make the draft free in the prediction (c = 0), then verification too (v = 1). Of the gap between
#    the ideal (1 − α^(K+1)) / (1 − α) and the prediction, how much is the draft's cost and how much
#    is v(K)? How much of the measured speedup's shortfall is neither?
# 3. A batch of B prompts makes the one-token call carry B rows, and so uses the idle arithmetic
#    itself. Predict v_B(4) for B = 8, then measure it:
#    `batched_forward_time` from `benchmarks/bench_batch.py`;
#    `batched_forward_time(target, 8, 5) / batched_forward_time(target, 8, 1)`.
