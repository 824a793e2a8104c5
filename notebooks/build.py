"""Write the notebooks from the cells below, and execute them so they are committed with outputs.

    python notebooks/build.py            # all of them
    python notebooks/build.py speed      # the ones whose name contains "speed"

Cells are kept here, as plain text, so that changes to them read well in a diff.
"""

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).parent

SETUP = '''\
MODELS = "bundled"  # "bundled": the offline tiny pair; "gpt2": GPT-2 124M drafting for 1558M (hub or cache)
DRAFT, TARGET = {"bundled": ("tiny-draft", "tiny-target"), "gpt2": ("gpt2", "gpt2-xl")}[MODELS]

import jax
import numpy as np
import picospec
from IPython.display import HTML, display

draft, target = picospec.load_model(DRAFT), picospec.load_model(TARGET)
tokenizer = picospec.load_tokenizer(TARGET)
print(f"draft {DRAFT}: {draft.config.n_layer} layers x {draft.config.n_embd}; "
      f"target {TARGET}: {target.config.n_layer} layers x {target.config.n_embd}")'''

NOTEBOOKS = {
    "1_one_generation_step_by_step": [
        ("md", """\
# One generation, step by step

Speculative sampling in one picture per iteration. The draft proposes K tokens, each sampled from its
distribution **p**; the target scores all of them in one forward call, giving **q** at each position.
Drafted token d_i is **accepted** if the uniform **u_i < q(d_i) / p(d_i)** (so with probability
min(1, q/p)). At the first rejection the target **resamples** from norm(max(0, q − p)) and the remaining
drafts are dropped; if all K are accepted, the target adds a **bonus** token from its next
distribution. Colours: accepted green, rejected red, resample yellow, bonus blue, dropped grey."""),
        ("code", SETUP),
        ("code", '''\
PROMPT, K, TEMPERATURE, N_TOKENS, SEED = "And God said unto Moses", 4, 1.0, 40, 0

from picospec.tools.display import coloured_text, step_table
from picospec.tools.stream import trace_steps

prompt = tokenizer.encode(PROMPT).ids
tokens, trace = picospec.speculative_sample(draft, target, prompt, N_TOKENS, jax.random.key(SEED),
                                            K=K, temperature=TEMPERATURE)
steps = trace_steps(trace, N_TOKENS)
for i, step in enumerate(steps):
    display(HTML(step_table(step, tokenizer, i) + coloured_text(steps[:i + 1], tokenizer, PROMPT) + "<hr>"))'''),
        ("md", "## What it added up to"),
        ("code", '''\
accepted = sum(s.accepted for s in steps)
print(f"{N_TOKENS} tokens in {len(steps)} target calls: {N_TOKENS / len(steps):.2f} tokens per call")
print(f"{accepted} of {K * len(steps)} drafted tokens accepted ({accepted / (K * len(steps)):.0%})")
print(f"bonus tokens: {sum(s.bonus for s in steps)}, resamples: {sum(not s.bonus for s in steps)}")
assert sum(len(s.tokens) for s in steps) == N_TOKENS'''),
        ("md", """\
## At temperature 0 it is the target's greedy output

With temperature 0 both p and q are one-hot, so a draft token is accepted exactly when it is the
target's argmax, and a resample is the target's argmax. The result is the target's own greedy output."""),
        ("code", '''\
greedy, trace0 = picospec.speculative_sample(draft, target, prompt, N_TOKENS, jax.random.key(0), K=K, temperature=0)
alone = picospec.autoregressive_sample(target, prompt, N_TOKENS, jax.random.key(0), temperature=0)
print(PROMPT + tokenizer.decode(greedy.tolist()))
print("identical to the target alone:", bool((greedy == alone).all()),
      f"| {N_TOKENS / int(trace0.n_steps):.2f} tokens per target call")'''),
    ],
    "2_accept_and_reject": [
        ("md", """\
# Accept and reject over a whole generation

How many tokens does each target call yield, and does the simple model of Leviathan et al. explain it?
Their model: each drafted token is accepted with the same probability α, independently, so the number
accepted per iteration is a geometric variable capped at K, and E[tokens per call] = (1 − α^(K+1)) / (1 − α)."""),
        ("code", SETUP),
        ("code", '''\
from picospec import theory

PROMPTS = ["And God said", "In the beginning", "And the LORD spake unto Moses, saying",
           "Blessed are the", "And it came to pass"]
K, N_TOKENS, RUNS = 4, 112, 8  # every prompt + N_TOKENS + K fits one 128-slot buffer: one compile

def run_all(temperature, K=K):
    """RUNS samples per prompt, vmapped over keys. Returns accepted counts, per-position acceptance,
    and the first sample (prompt included) as a token list."""
    counts, per_position, reached, first = [], np.zeros(K), np.zeros(K), None
    for prompt_text in PROMPTS:
        prompt = tokenizer.encode(prompt_text).ids
        keys = jax.random.split(jax.random.key(1), RUNS)
        tokens, traces = jax.vmap(lambda k: picospec.speculative_sample(
            draft, target, prompt, N_TOKENS, k, K=K, temperature=temperature))(keys)
        first = first or (prompt, prompt + np.asarray(tokens[0]).tolist())
        for r in range(RUNS):
            a = np.asarray(traces.n_accepted[r, :int(traces.n_steps[r])])
            counts.append(a)
            reached += (np.arange(K)[None, :] <= a[:, None]).sum(0)  # positions a decision was made at
            per_position += (np.arange(K)[None, :] < a[:, None]).sum(0)  # ... and the token accepted
    return counts, per_position / reached, first

counts, alpha_by_position, _ = run_all(1.0)
a = np.concatenate(counts)
alpha = theory.alpha_from_trace(a, K)
print(f"{len(a)} iterations; alpha (maximum likelihood) = {alpha:.3f}")
print(f"tokens per call: measured {np.mean(a + 1):.3f}, predicted {theory.expected_tokens_per_call(alpha, K):.3f}")'''),
        ("code", '''\
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 3, figsize=(15, 3.6))
axes[0].bar(np.arange(len(counts[0])), counts[0] + 1, color="tab:green")
axes[0].set(title=f"one generation: tokens per iteration (K={K})", xlabel="iteration", ylabel="tokens added")
lengths = np.bincount(a, minlength=K + 1) / len(a)
axes[1].bar(np.arange(K + 1) - 0.2, lengths, 0.4, label="measured")
axes[1].bar(np.arange(K + 1) + 0.2, theory.accepted_length_law(alpha, K), 0.4, label=f"capped geometric, α={alpha:.2f}")
axes[1].set(title="drafts accepted per iteration", xlabel="accepted", ylabel="fraction"); axes[1].legend()
axes[2].plot(np.arange(1, K + 1), alpha_by_position, "o-")
axes[2].axhline(alpha, ls="--", color="gray", label="overall α")
axes[2].set(title="acceptance by position in the draft block", xlabel="position", ylabel="P(accept | reached)", ylim=(0, 1))
axes[2].legend(); plt.tight_layout(); plt.show()'''),
        ("md", """\
The geometric model assumes every position is alike. A later position is reached only after every
earlier draft was accepted, so it is reached in easier contexts; the per-position rate shows how far
the assumption holds for this pair.

## α against temperature

The measured α (from traces) beside α computed exactly, as the mean of Σ min(p, q) over the positions
of a generated text, from both models' full distributions."""),
        ("code", '''\
from picospec.sampling import Sampling, logits_to_probs

def exact_alpha(temperature, prompt, seq):
    """The mean of sum(min(p, q)) over the generated positions of seq (a sample at this temperature)."""
    s = Sampling(temperature)
    p = logits_to_probs(picospec.logits(draft, seq)[len(prompt) - 1:-1], s)
    q = logits_to_probs(picospec.logits(target, seq)[len(prompt) - 1:-1], s)
    return theory.alpha_exact(np.asarray(p), np.asarray(q))

temperatures = [0.0, 0.5, 1.0, 1.5]
measured, exact = [], []
for t in temperatures:
    counts_t, _, (prompt, seq) = run_all(t)
    measured.append(theory.alpha_from_trace(np.concatenate(counts_t), K))
    exact.append(exact_alpha(t, prompt, seq))
for t, m, e in zip(temperatures, measured, exact):
    print(f"T={t:4.2f}  measured α={m:.3f}  exact Σmin(p,q)={e:.3f}")
plt.figure(figsize=(5, 3.5))
plt.plot(temperatures, measured, "o-", label="measured (traces)")
plt.plot(temperatures, exact, "s--", label="exact Σ min(p, q)")
plt.xlabel("temperature"); plt.ylabel("α"); plt.ylim(0, 1); plt.legend(); plt.show()'''),
    ],
    "3_speed": [
        ("md", """\
# Speed: what α, c and v(K) predict, and what we measure

The walltime improvement of Leviathan et al., with a verification cost:
speedup = (1 − α^(K+1)) / ((1 − α)(K·c + v(K))), where c is a draft step's time over a target step's
and v(K) is the target's time to score K + 1 tokens over its time for one. Everything here is measured
in this run, on this machine. On a CPU the tiny pair is far from memory-bound and per-call overhead is a
large share of each step, so c is much larger than the parameter ratio suggests: that is as much the
lesson of this notebook as the speedup itself. Switch MODELS to "gpt2" to see the GPT-2 pair."""),
        ("code", SETUP),
        ("code", '''\
import time
import jax.numpy as jnp
from picospec import theory
from picospec.gpt2 import forward, init_cache

def best_time(fn, repeats=5):
    fn()  # warm-up: compile
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return min(times)

def step_time(model, T, calls=20):
    """Seconds per forward call feeding T tokens after 64 cached positions (cache of 256)."""
    def run():
        cache = forward(model.params, jnp.zeros(64, jnp.int32), init_cache(model.config, 256), model.config)[1]
        for _ in range(calls):
            logits, cache = forward(model.params, jnp.zeros(T, jnp.int32), cache, model.config)
            cache = cache._replace(length=cache.length - T)
        logits.block_until_ready()
    return best_time(run) / calls

t_target, t_draft = step_time(target, 1), step_time(draft, 1)
c = t_draft / t_target
v = {K: step_time(target, K + 1) / t_target for K in range(1, 9)}
print(f"target step {t_target * 1e3:.2f} ms, draft step {t_draft * 1e3:.2f} ms, c = {c:.3f}")
print("v(K):", {K: round(x, 2) for K, x in v.items()})'''),
        ("code", '''\
PROMPT, N_TOKENS = "And the LORD spake unto Moses, saying", 160
prompt = tokenizer.encode(PROMPT).ids
key = jax.random.key(0)
ar_time = best_time(lambda: picospec.autoregressive_sample(target, prompt, N_TOKENS, key, temperature=0).block_until_ready(), 3)
rows = []
for K in range(1, 9):
    run = lambda: picospec.speculative_sample(draft, target, prompt, N_TOKENS, key, K=K, temperature=0)
    spec_time = best_time(lambda: run()[0].block_until_ready(), 3)
    trace = run()[1]
    a = np.asarray(trace.n_accepted[:int(trace.n_steps)])
    alpha = theory.alpha_from_trace(a, K)
    rows.append((K, N_TOKENS / len(a), float(theory.expected_tokens_per_call(alpha, K)), ar_time / spec_time,
                 float(theory.walltime_improvement(alpha, K, c, v[K])), alpha))
print(" K  tokens/call: measured  theory   speedup: measured  theory   alpha")
for K, tpc, tpc_th, sp, sp_th, alpha in rows:
    print(f"{K:2d}  {tpc:21.2f} {tpc_th:7.2f}  {sp:17.2f} {sp_th:7.2f}   {alpha:.3f}")'''),
        ("code", '''\
import matplotlib.pyplot as plt
Ks = [r[0] for r in rows]
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
axes[0].plot(Ks, [r[1] for r in rows], "o-", label="measured"); axes[0].plot(Ks, [r[2] for r in rows], "s--", label="theory from α")
axes[0].set(title="tokens per target call", xlabel="K"); axes[0].legend()
axes[1].plot(Ks, [r[3] for r in rows], "o-", label="measured"); axes[1].plot(Ks, [r[4] for r in rows], "s--", label="theory from α, c, v(K)")
axes[1].axhline(1, color="gray", lw=0.8); axes[1].set(title="walltime speedup over autoregressive", xlabel="K"); axes[1].legend()
plt.tight_layout(); plt.show()
best = theory.optimal_K(np.mean([r[5] for r in rows]), c, v=lambda K: v.get(K, v[8]), K_max=8)
print(f"theory's optimal K for the measured α, c and v: {best}")'''),
        ("md", """\
## A draft that is not a model: n-gram lookup

`NGramDraft` proposes the K tokens that followed the latest earlier occurrence of the text's last
n-gram (prompt lookup decoding). Its c is essentially 0, and its α depends entirely on how much the
output repeats what came before: input-grounded text (quoting, editing) and the loops a small greedy
model falls into both qualify. Same loop, same exactness."""),
        ("code", '''\
GROUNDED = "In the beginning God created the heaven and the earth. In the beginning God"
prompt = tokenizer.encode(GROUNDED).ids
ar_time = best_time(lambda: picospec.autoregressive_sample(target, prompt, N_TOKENS, key, temperature=0).block_until_ready(), 3)
print(" draft        tokens/call  speedup  identical to target alone")
for name, d in [("ngram (n<=3)", picospec.NGramDraft(3)), ("tiny-draft", draft)]:
    run = lambda: picospec.speculative_sample(d, target, prompt, N_TOKENS, key, K=4, temperature=0)
    t = best_time(lambda: run()[0].block_until_ready(), 3)
    tokens, trace = run()
    same = bool((tokens == picospec.autoregressive_sample(target, prompt, N_TOKENS, key, temperature=0)).all())
    print(f" {name:12s} {N_TOKENS / int(trace.n_steps):11.2f} {ar_time / t:8.2f}  {same}")'''),
    ],
    "4_losslessness": [
        ("md", """\
# Losslessness, seen

Speculative sampling promises that its output follows the target's distribution exactly, whatever the
draft. For the first token after a prompt, we draw 10,000 speculative samples at once (`jax.vmap` over
keys) and set their histogram beside the target's exact distribution q and the draft's p. The tests
(tests/test_speculative.py) prove the same for the joint law of three tokens, with chi-square tests
and controls that a wrong sampler fails."""),
        ("code", SETUP),
        ("code", '''\
from scipy.stats import chisquare
from picospec.sampling import Sampling, logits_to_probs

PROMPT, TOP_K, N = "And he said", 8, 10_000
prompt = tokenizer.encode(PROMPT).ids
s = Sampling(1.0, TOP_K)
q = np.asarray(logits_to_probs(picospec.logits(target, prompt)[-1], s), np.float64)
p = np.asarray(logits_to_probs(picospec.logits(draft, prompt)[-1], s), np.float64)
keys = jax.random.split(jax.random.key(0), N)
first = jax.vmap(lambda k: picospec.speculative_sample(draft, target, prompt, 1, k, K=4, top_k=TOP_K)[0][0])(keys)
counts = np.bincount(np.asarray(first), minlength=q.size)
support = np.flatnonzero((p > 0) | (q > 0) | (counts > 0))
print("tokens in either support:", [tokenizer.decode([t]) for t in support])
print("samples outside the target's support:", int(counts[q == 0].sum()))
expected_q = N * q[q > 0] / q[q > 0].sum()
print(f"chi-square against the target q: p-value {chisquare(counts[q > 0], expected_q, sum_check=False).pvalue:.3f}")
print(f"total variation between the samples and q: {0.5 * np.abs(counts / N - q).sum():.4f}, "
      f"between the samples and the draft's p: {0.5 * np.abs(counts / N - p).sum():.4f}")'''),
        ("code", '''\
import matplotlib.pyplot as plt
x = np.arange(len(support))
plt.figure(figsize=(10, 3.6))
plt.bar(x - 0.27, p[support], 0.27, label="draft p", color="tab:gray")
plt.bar(x, q[support], 0.27, label="target q (exact)", color="tab:blue")
plt.bar(x + 0.27, counts[support] / N, 0.27, label="speculative samples", color="tab:orange")
plt.xticks(x, [repr(tokenizer.decode([t])) for t in support], rotation=45)
plt.ylabel("probability"); plt.legend(); plt.title(f"first token after {PROMPT!r}, top-k={TOP_K}")
plt.tight_layout(); plt.show()'''),
    ],
}


def build(name, cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "md" else nbformat.v4.new_code_cell(src)
                for kind, src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    NotebookClient(nb, timeout=1200, resources={"metadata": {"path": str(HERE)}}).execute()
    nbformat.write(nb, HERE / f"{name}.ipynb")
    print(f"wrote notebooks/{name}.ipynb")


if __name__ == "__main__":
    for name, cells in NOTEBOOKS.items():
        if len(sys.argv) < 2 or any(arg in name for arg in sys.argv[1:]):
            build(name, cells)
