"""Train an EAGLE head (beyond/eagle.py) against the frozen bundled target, on the bundled corpus.

    python -m picospec.tools.train --head --out weights     # about an hour on 2 CPU cores

The target is tiny-target exactly as shipped, and frozen: the head learns the target, not the text. For every window of
the training text the target computes, once, its features f_t (what its LM head reads; its next-token distribution is
q_t = softmax(f_t W)). The head, fed the pairs (f_{t-1}, x_t) (teacher forcing on the target's own features), guesses
g_t. The loss is EAGLE-1's: smooth-L1 of g_t against f_t (the feature regression), plus 0.1 x the cross-entropy of
softmax(g_t W) against q_t (the token loss, what acceptance depends on; 0.1, the paper's weight, kept more than 1.0 did
in a 300-step trial). As in the paper, uniform noise U(-0.1, 0.1) on the fed features (their spread is about 1.2)
prepares the head to draft from its own guesses. The head is then measured on held-out text against tiny-draft and saved
beside the pair, with a report and its loss curve. The same --seed gives the same head.
"""

import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from picospec.beyond import theory
from picospec.beyond.eagle import HeadCache, HeadDraft, head_forward, init_head, target_features
from picospec.gpt2 import Model, init_cache
from picospec.tools.checkpoints.head import save_head
from picospec.tools.checkpoints.weights import load_model, load_tokenizer
from picospec.tools.train import acceptance, adamw, as_stored
from picospec.tools.train.corpus import corpus

WINDOW, BATCH, STEPS, LR = 256, 8, 10000, 3e-3  # 3e-3 learned fastest of 1e-3, 3e-3, 1e-2 (150 steps)
NOISE, W_CLS = 0.1, 0.1  # EAGLE-1's feature noise and token-loss weight
HELD_OUT = 20  # prompts of 32 held-out tokens, each continued by 64, measure the acceptance (as the pair's report)


@jax.jit
def target_view(target: Model, x):  # [B, T] -> the target's features f [B, T, C] (after its final norm)
    plain = Model(target.config, target.params)  # the plain products: vmapped and differentiated here
    return jax.vmap(lambda tokens: target_features(plain, tokens, init_cache(target.config, tokens.shape[0]))[0])(x)


def corpus_features(target: Model, tokens: np.ndarray, log=print):
    """Every window of WINDOW tokens (starting at 0, WINDOW / 2 apart), int32 [N, W], and the target's features for
    each, f float32 [N, W, C]: computed once (the target is frozen), as EAGLE precomputes its training data."""
    starts = range(0, len(tokens) - WINDOW, WINDOW // 2)
    windows = np.stack([tokens[s:s + WINDOW] for s in starts])
    f = np.concatenate([np.asarray(target_view(target, jnp.asarray(windows[i:i + 32])))
                        for i in range(0, len(windows), 32)])
    log(f"  the target's features for {len(windows):,} windows: {f.nbytes / 2**30:.1f} GiB")
    return windows, f


def head_view(params, target: Model, fed, x):  # fed [B, T, C], x [B, T] -> g [B, T, C], log p [B, T, V]
    config, plain = target.config, Model(target.config, target.params)
    draft = HeadDraft(params, config, plain)
    empty = jnp.zeros((config.n_head, x.shape[1], config.n_embd // config.n_head))

    def one(f, tokens):
        g, logits, _ = head_forward(draft, f, tokens, HeadCache([empty], [empty], jnp.int32(0), f))
        return g, jax.nn.log_softmax(logits)
    return jax.vmap(one)(fed, x)


def loss_fn(params, target: Model, x, f, key):  # x [B, T] tokens, f [B, T, C] the target's features
    log_q = jax.nn.log_softmax(f @ target.params["wte"]["weight"].T)  # [B, T, V]: the target's own q
    fed = jnp.concatenate([jnp.zeros_like(f[:, :1]), f[:, :-1]], axis=1)  # f_{t-1}, f_{-1} = 0
    fed = fed + jax.random.uniform(key, fed.shape, minval=-NOISE, maxval=NOISE)
    g, log_p = head_view(params, target, fed, x)
    regression = optax.huber_loss(g, f, delta=1.0).mean()  # smooth L1
    token = -(jnp.exp(log_q) * log_p).sum(-1).mean()
    return regression + W_CLS * token, (regression, token)


def train_head(target: Model, tokens: np.ndarray, steps: int, seed: int, log=print):
    """The head's params after `steps` steps, and the loss curve [(step, loss, regression, token)]."""
    windows, features = corpus_features(target, tokens, log)
    params, optimizer = init_head(target.config, jax.random.key(seed)), adamw(LR, steps)
    opt_state, rng, curve, t0 = optimizer.init(params), np.random.default_rng(seed), [], time.time()

    @jax.jit
    def step(params, opt_state, x, f, key):
        (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, target, x, f, key)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, parts

    keys = jax.random.split(jax.random.key(seed + 1), steps)
    for i in range(steps):
        batch = rng.integers(0, len(windows), BATCH)
        params, opt_state, loss, (regression, token) = step(params, opt_state, windows[batch], features[batch], keys[i])
        if i % 25 == 0 or i == steps - 1:
            curve.append((i, float(loss), float(regression), float(token)))
            log(f"  step {i:5d}/{steps}  loss {curve[-1][1]:.3f} (regression {curve[-1][2]:.3f}, token "
                f"{curve[-1][3]:.3f})  {time.time() - t0:6.0f}s")
    return params, curve


def draw_curve(curve, path: Path):
    from matplotlib.figure import Figure
    steps, loss, regression, token = zip(*curve)
    fig = Figure(figsize=(6, 3.2))
    ax = fig.add_subplot()
    ax.plot(steps, regression, label="feature regression (smooth L1)")
    ax.plot(steps, [W_CLS * t for t in token], label=f"{W_CLS} x token cross-entropy")
    ax.plot(steps, loss, label="loss", color="black")
    ax.set(xlabel="step", title="The EAGLE head learning tiny-target's features")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(out: Path, seed: int, steps: int = STEPS, log=print):
    t0, target, tokenizer = time.time(), load_model("tiny-target"), load_tokenizer("tiny-target")
    train_text, held_text = corpus()
    tokens, held = (np.array(tokenizer.encode(text).ids, np.int32) for text in (train_text, held_text))
    log(f"training an EAGLE head against tiny-target: {len(tokens):,} training tokens, {steps} steps")
    params, curve = train_head(target, tokens, steps, seed, log)
    head = as_stored(HeadDraft(params, target.config, target))
    prompts = [held[s:s + 32] for s in np.random.default_rng(seed).integers(0, len(held) - 32, HELD_OUT)]
    report = {"seed": seed, "steps": steps, "window": WINDOW, "batch": BATCH, "learning_rate": LR, "noise": NOISE,
              "token_loss_weight": W_CLS, "target": "tiny-target", "curve": curve, "held_out": {}}
    for name, draft in [("tiny-head", head), ("tiny-draft", load_model("tiny-draft"))]:
        for temperature in (0.0, 1.0):
            for K in (4, 7):
                rate, counts = acceptance(draft, target, prompts, temperature, K)
                by_position = theory.alpha_by_position(counts, K)[0].round(4).tolist()  # alpha_i (theory.py)
                report["held_out"][f"{name} T{temperature:g} K{K}"] = {"acceptance": rate, "by_position": by_position}
                log(f"{name} T={temperature:g} K={K}: acceptance {rate:.3f}, by position {by_position}")
    report["seconds"] = round(time.time() - t0)
    folder = out / "tiny-head"
    save_head(head, "tiny-target", folder)
    draw_curve(curve, folder / "loss.png")
    (folder / "training_report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"wrote {folder}")
    return report
