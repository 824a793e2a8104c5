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
# # The ladder of verifiers
#
# Steps 3 and 4 of speculative sampling decide how many of the K drafted tokens to keep, and draw one
# more. Three rules do it losslessly (`picospec/beyond/verifiers.py`, `picospec/speculative.py`):
#
# - **match**: keep d_i while it equals a token the target samples itself at that position;
# - **token**: keep d_i with probability min(1, q(d_i)/p(d_i)), resample a rejection from norm(max(0, q − p));
# - **block**: judge the drafts as one block (Sun et al. 2024): a weight w_i = min(1, w_{i−1} q/p) carries
#   over from one draft to the next, so a later draft that q likes more than p can make up for an
#   earlier one it liked less.
#
# Each emits the target's law exactly (`tests/test_verifiers.py` enumerates it); they differ in how
# many drafts one target call keeps.

# %%
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import picospec
from picospec.beyond import theory
from picospec.beyond.verifiers import RULES, block_residuals

plt.rcParams.update({"figure.dpi": 110, "legend.fontsize": 9})
QUICK = bool(os.environ.get("PICOSPEC_NOTEBOOK_QUICK"))  # the test suite's shorter run

# %% [markdown]
# ## A worked example: three tokens, two drafts
#
# The draft proposed d_0 = `a` then d_1 = `b`. The target likes `a` half as much as the draft did,
# and `b` twice as much.

# %%
p = np.array([[0.6, 0.3, 0.1],   # the draft's p[0]: it drew d_0 = a (token 0)
              [0.7, 0.2, 0.1]])  # p[1]: it drew d_1 = b (token 1)
q = np.array([[0.3, 0.5, 0.2],   # the target's q[0]
              [0.1, 0.4, 0.5],   # q[1]
              [0.4, 0.4, 0.2]])  # q[2], for the bonus
d = np.array([0, 1])
ratio = q[[0, 1], d] / p[[0, 1], d]
w, h, residual = (np.asarray(x) for x in block_residuals(jnp.array(d), jnp.float32(p), jnp.float32(q)))
print("q/p of each draft:", ratio)
print("token rule: keeps d_0 with probability", min(1, ratio[0]), "and then d_1 with", min(1, ratio[1]))
print("block rule: weights w_1, w_2 =", w[1:], " stop chances h_1, h_2 =", h[1:].round(3))

# %% [markdown]
# The token rule decides each draft alone: it throws `a` away half the time, and `b` with it. The
# block rule asks whether the *block* is as likely under q as under p: w_2 = min(1, 0.5 · 2) = 1, so
# h_2 = w_2 = 1 and it keeps both, always. The law of what comes out is the same; below, each
# rule's chance of keeping 0, 1 or 2 drafts, **computed** from the rule and **measured** by running
# picospec's own function with 20,000 keys.

# %%
def kept_law(rule):  # P(keep 0, 1, 2 drafts) for this drafted block, from the rule's definition
    if rule == "match":  # the target's own samples must equal d_0, then d_1
        return np.array([1 - q[0, 0], q[0, 0] * (1 - q[1, 1]), q[0, 0] * q[1, 1]])
    if rule == "token":
        a0, a1 = min(1, ratio[0]), min(1, ratio[1])
        return np.array([1 - a0, a0 * (1 - a1), a0 * a1])
    return np.array([(1 - h[1]) * (1 - h[2]), h[1] * (1 - h[2]), h[2]])  # block: the largest i with u_i < h_i


keys = jax.random.split(jax.random.key(0), 20_000)
fig, ax = plt.subplots(figsize=(8.5, 3.2))
for j, rule in enumerate(["match", "token", "block"]):
    run = jax.vmap(lambda k: RULES[rule](k, jax.random.fold_in(k, 1), jnp.array(d), jnp.float32(p), jnp.float32(q))[0])
    measured = np.bincount(np.asarray(run(keys)), minlength=3) / len(keys)
    ax.bar(np.arange(3) + 0.27 * (j - 1), kept_law(rule), 0.25, label=f"{rule} (computed)", alpha=0.75)
    ax.plot(np.arange(3) + 0.27 * (j - 1), measured, "k.", label="measured" if j == 2 else None)
    print(f"{rule:5s} computed {kept_law(rule).round(3)}  measured {measured.round(3)}")
ax.set_xticks(range(3), ["0 kept", "1 kept", "2 kept"])
ax.set_xlabel("drafts kept of d_0 = a, d_1 = b")
ax.set_ylabel("probability")
ax.set_title("how many drafts each rule keeps, computed and measured")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
plt.tight_layout()
plt.show()

# %% [markdown]
# ## On the bundled pair
#
# Tokens per target call (kept drafts + 1) for each rule at temperature 0.8, **measured** over many
# runs, against the **prediction** of the capped geometric law (Leviathan et al.) from each rule's
# own acceptance rate α measured in the same runs. The token rule follows it; the match rule too
# (its α is Σ p·q); the block rule keeps more than the token rule with the same draft, and its
# drafts are not kept one by one with a fixed chance, so the geometric law has no α for it: it is
# drawn as measured, against the token rule's line.

# %%
draft, target = picospec.load_model("tiny-draft"), picospec.load_model("tiny-target")
prompt = picospec.load_tokenizer("tiny-target").encode("And God said").ids
KS, RUNS, N = ((1, 2, 4), 16, 32) if QUICK else ((1, 2, 3, 4, 6), 64, 64)
measured, alpha = {}, {}
for rule in ("match", "token", "block"):
    for K in KS:
        keys = jax.random.split(jax.random.key(K), RUNS)
        _, trace = picospec.speculative_sample_batch(draft, target, [prompt] * RUNS, N, keys, K=K, temperature=0.8,
                                                     verify=rule)
        n, kept = np.asarray(trace.n_steps), np.asarray(trace.n_accepted)
        rows = np.concatenate([kept[b, :n[b]] for b in range(RUNS)])
        measured[rule, K], alpha[rule, K] = rows.mean() + 1, float(theory.alpha_from_trace(jnp.array(rows), K))
fig, ax = plt.subplots(figsize=(8.5, 3.4))
for rule, colour in [("match", "C0"), ("token", "C1"), ("block", "C2")]:
    ax.plot(KS, [measured[rule, K] for K in KS], "o", color=colour, label=f"{rule}, measured")
    if rule != "block":
        ax.plot(KS, [float(theory.expected_tokens_per_call(alpha[rule, K], K)) for K in KS], "-", color=colour,
                label=f"{rule}, predicted from its α")
ax.set_xlabel("K")
ax.set_ylabel("tokens per target call")
ax.set_title("tokens per call by rule, bundled pair, temperature 0.8")
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
plt.tight_layout()
plt.show()
for K in KS:
    print(f"K = {K}: " + ", ".join(f"{rule} {measured[rule, K]:.2f}" for rule in ("match", "token", "block")))

# %% [markdown]
# ## Several drafts
#
# With `drafts=N` the draft samples N independent chains, and the target scores them in one call as
# the tree of N branches from the root: N K + 1 positions in one cache (`picospec/beyond/several.py`). At each depth the chains still alive are tried in
# turn against a residual that shrinks after every rejection (recursive rejection sampling), so one
# position is kept with chance α_N = 1 − Π_m (1 − Σ_x min(p, r_m)) (`theory.alpha_several`), more than
# α. Below, tokens per call **measured** for N = 1, 2, 4 (token rule, K = 3, temperature 0.8) beside
# the geometric law's **prediction** with α_N, computed from the pair's own p and q along the held-out
# text (`weights/heldout_sample.txt`, not the text these runs generate, so even at N = 1 the two differ a
# little, either way). For N > 1 the measurement falls further below it: after a depth only the chains
# that drafted the kept token go on, so the deeper positions see fewer candidates than N.

# %%
from picospec.sampling import logits_to_probs  # noqa: E402
from picospec.tools.checkpoints.weights import BUNDLED_DIR  # noqa: E402

heldout = (BUNDLED_DIR / "heldout_sample.txt").read_text()
text = picospec.load_tokenizer("tiny-target").encode(heldout).ids[:256]  # the context: 256 tokens of held-out text
p_text, q_text = (np.asarray(logits_to_probs(picospec.logits(m, text), picospec.Sampling(0.8))) for m in (draft, target))
NS, K3 = (1, 2, 4), 3
several = {}
for n_drafts in NS:
    keys = jax.random.split(jax.random.key(7), RUNS)
    _, trace = picospec.speculative_sample_batch(draft, target, [prompt] * RUNS, N, keys, K=K3, temperature=0.8,
                                                 drafts=n_drafts)
    n, kept = np.asarray(trace.n_steps), np.asarray(trace.n_accepted)
    several[n_drafts] = np.concatenate([kept[b, :n[b]] for b in range(RUNS)]).mean() + 1
predicted = [float(theory.expected_tokens_per_call(theory.alpha_several(p_text, q_text, n), K3)) for n in NS]
fig, ax = plt.subplots(figsize=(8.5, 3.2))
ax.plot(NS, [several[n] for n in NS], "o", label="measured")
ax.plot(NS, predicted, "-", label="predicted: geometric law with α_N")
ax.set_xlabel("drafts N")
ax.set_ylabel("tokens per target call")
ax.set_title(f"several drafts, token rule, K = {K3}, temperature 0.8")
ax.set_xticks(NS)
ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1))
plt.tight_layout()
plt.show()
for n, b in zip(NS, predicted):
    print(f"N = {n}: measured {several[n]:.2f}, predicted {b:.2f}, α_N {theory.alpha_several(p_text, q_text, n):.3f}")

# %% [markdown]
# ## Adaptive K
#
# `--K auto` (`picospec/beyond/adaptive.py`) picks, before each call, the k that maximizes expected tokens per
# unit of time, E[1 + α + … + α^k] / (k c + v(k)), with the costs timed on this machine and the
# expectation taken over α's posterior given the calls so far: each draft judged counts its chance of
# acceptance, β = Σ_x min(p(x), q(x)), rather than whether it was accepted (less noise). Here the
# costs are fixed by hand (c = 0.25, v(k) = 1 + 0.1 k) so the run is the same everywhere: the k chosen
# at each call follows the evidence, and the output is still exactly the target's (stopping early is
# the draft proposing a token q never accepts).

# %%
from picospec.beyond.policy import Policy, alpha_estimate  # noqa: E402

policy = Policy(jnp.float32(0.25), 1 + 0.1 * jnp.arange(0, 9, dtype=jnp.float32), jnp.float32(0))  # k = 0..8
_, trace = picospec.speculative_sample(draft, target, prompt, 100, jax.random.key(3), K=8, temperature=0.8,
                                       policy=policy)
steps = int(trace.n_steps)
k_chosen, kept = np.asarray(trace.k[:steps]), np.asarray(trace.n_accepted[:steps])
alpha_seen = [float(alpha_estimate(trace._replace(k=trace.k.at[i:].set(0)))) for i in range(steps)]
fig, ax = plt.subplots(figsize=(8.5, 3.2))
ax.step(range(steps), k_chosen, where="mid", label="k drafted")
ax.plot(range(steps), kept, "k.", label="kept")
ax2 = ax.twinx()
ax2.plot(range(steps), alpha_seen, "C1-", label="α's posterior mean before the call")
ax2.set_ylim(0, 1)
ax2.set_ylabel("α (posterior mean)")
ax.set_xlabel("target call")
ax.set_ylabel("drafts")
ax.set_title("adaptive K: the k chosen each call, and what the calls so far say of α")
fig.legend(loc="upper left", bbox_to_anchor=(0.83, 0.85))
fig.tight_layout(rect=(0, 0, 0.82, 1))
plt.show()
print(f"{steps} calls for 100 tokens; k drafted: mean {k_chosen.mean():.2f}, from {k_chosen.min()} to {k_chosen.max()}")

# %% [markdown]
# ## From chain to tree
#
# A chain bets on one guess per position. A tree (`picospec/beyond/tree.py`) keeps several: every node is a
# drafted token whose parent is an earlier node, the target scores all of them in one call (each node
# attends to the text and to its own ancestors only), and verification walks down from the root,
# trying a node's children in turn against the residual r, as several drafts do. Below, one real
# iteration with a tree of 8 nodes, theory's best shape for an acceptance of 0.6, children drawn
# independently from the draft: the accepted path in bold green, the children tried and rejected in
# red, the ones never tried in grey.

# %%
from picospec.autoregressive import buffers  # noqa: E402
from picospec.beyond import tree_theory  # noqa: E402
from picospec.beyond.loop import ModelDraft, start  # noqa: E402
from picospec.beyond.tree import Shape, TreeDraft, feed  # noqa: E402
from picospec.beyond.tree_verify import verify_tree  # noqa: E402
from picospec.sampling import Sampling, logits_to_probs  # noqa: E402

shape, sampling = Shape(tree_theory.optimal_tree(8, tree_theory.rank_acceptance(0.6, 8))), Sampling(0.8)
tree_draft = TreeDraft(ModelDraft(draft), shape, "iid")
tokens_buffer, prefill_len, max_len = buffers(prompt, 16, shape.M, target.config)
state = start(tree_draft, target, jnp.asarray(tokens_buffer), len(prompt), jax.random.key(5), shape.M, prefill_len,
              max_len)


@jax.jit
def one_tree(state, key):  # steps 1 to 4 of tree_verify.tree_step: grow, score in one call, walk down
    key_draft, key_accept, key_extra = jax.random.split(key, 3)
    grown = tree_draft.propose(state, key_draft, shape.M, sampling)
    q_tree = logits_to_probs(feed(target, grown.tokens, state.target_cache, state.n - 1, np.arange(shape.M + 1),
                                  shape)[0], sampling)  # [M+1, V]
    return grown.tokens, verify_tree(key_accept, key_extra, shape, "iid", grown, q_tree)


tree_tokens, (path, verdict) = one_tree(state, jax.random.key(30))
a, path = int(verdict.n_accepted), [int(j) for j in np.asarray(path)[:int(verdict.n_accepted) + 1]]
decode = picospec.load_tokenizer("tiny-target").decode
parents = (None,) + shape.parents
status = {}
for j in range(1, shape.M + 1):
    if j in path:
        status[j] = "accepted"
    elif parents[j] in path:  # a sibling on a path node: tried before the accepted child, or all of them
        nxt = path[path.index(parents[j]) + 1] if path.index(parents[j]) < a else None
        status[j] = "rejected" if nxt is None or j < nxt else "not tried"
    else:
        status[j] = "not reached"
colour = {"accepted": "C2", "rejected": "C3", "not tried": "0.6", "not reached": "0.8"}
row = {j: list(shape.level(shape.depth[j])).index(j) for j in range(shape.M + 1)}
fig, ax = plt.subplots(figsize=(7.5, 2.6))
for j in range(1, shape.M + 1):
    ax.plot([shape.depth[parents[j]], shape.depth[j]], [-row[parents[j]], -row[j]], "-",
            color=colour[status[j]], lw=3 if status[j] == "accepted" else 1)
for j in range(shape.M + 1):
    ax.text(shape.depth[j], -row[j], repr(decode([int(tree_tokens[j])])), ha="center", va="center",
            fontweight="bold" if j in path else "normal", color="k" if j == 0 else colour[status[j]],
            bbox=dict(boxstyle="round", fc="white", ec=colour.get(status.get(j), "k")))
ax.set_xlim(-0.5, shape.D + 0.5)
ax.set_ylim(-max(row.values()) - 0.6, 0.6)
ax.set_xticks(range(shape.D + 1))
ax.set_yticks([])
ax.set_xlabel("depth (position after the text)")
ax.set_ylabel("nodes at that depth")
ax.set_title(f"one tree of {shape.M} nodes: drafts accepted {a}, then {decode([int(verdict.extra)])!r}")
plt.tight_layout()
plt.show()

# %% [markdown]
# Tokens per target call at the same 8 drafted nodes per call (9 positions scored): one chain, two
# chains from the root, and theory's best tree for the chain's measured α, against what theory
# predicts for each shape under a constant α. On this pair α is high, so a chain's next node is often
# worth more than a second child (here theory's tree is the chain itself, and runs as one): trees pay
# where α is lower or the budget larger (`benchmarks/trees.py`).

# %%
from picospec.beyond.tree import branches  # noqa: E402

runs = 4 if QUICK else 32
keys_tree = jax.random.split(jax.random.key(21), runs)
_, chain_trace = picospec.speculative_sample_batch(draft, target, [prompt] * runs, 64, keys_tree, K=8, temperature=0.8)
n_chain = np.asarray(chain_trace.n_steps)
kept_chain = np.concatenate([np.asarray(chain_trace.n_accepted[b, :n_chain[b]]) for b in range(runs)])
alpha_chain = theory.alpha_from_trace(kept_chain, 8)
best = Shape(tree_theory.optimal_tree(8, tree_theory.rank_acceptance(alpha_chain, 8)))
for name, kw in {"chain of 8": dict(K=8), "2 chains of 4": dict(tree=branches(2, 4)),
                 "theory's tree": dict(tree=best)}.items():
    _, tr = picospec.speculative_sample_batch(draft, target, [prompt] * runs, 64, keys_tree, temperature=0.8, **kw)
    n = np.asarray(tr.n_steps)
    measured = np.mean([(np.asarray(tr.n_accepted[b, :n[b]]) + 1).mean() for b in range(runs)])
    parents_of = kw["tree"].parents if "tree" in kw else tuple(range(8))
    edges = tree_theory.rank_edges(parents_of, tree_theory.rank_acceptance(alpha_chain, 8))
    predicted = tree_theory.tree_tokens_per_call(parents_of, edges)
    print(f"{name:14s} parents {list(parents_of)}: measured {measured:.2f} tokens per call, theory {predicted:.2f}")
