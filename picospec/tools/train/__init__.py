"""Train the bundled pair on the King James Bible: tiny-target, and a tiny-draft distilled from it.

    apt-get install bible-kjv          # the corpus: public-domain English, 4.4 MB
    pip install -e ".[train]"          # optax
    python -m picospec.tools.train --out weights
    python -m picospec.tools.train --head --out weights   # an EAGLE head for tiny-target (head.py)

Steps: train a byte-level BPE tokenizer; train the target; train the draft by distillation (cross-entropy against the
target's distribution; --drafts text or both also trains one on the text); measure held-out perplexity and the pair's
acceptance rate; save the target and the better draft as Hugging Face GPT-2 checkpoints, with a report. The same --seed
gives the same models. On 2 CPU cores the target takes about 70 minutes and the draft 45.
"""

import argparse
import dataclasses
import json
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from picospec import fastpath
from picospec.gpt2 import GPT2Config, Model, forward, init_cache, init_params
from picospec.tools.checkpoints.config import config_json
from picospec.tools.checkpoints.weights import load_model, save_checkpoint
from picospec.tools.samplers import speculative_sample
from picospec.tools.train.corpus import VOCAB, corpus, train_tokenizer, write_heldout_sample

CONTEXT = 256
# The bundled pair: a 6 x 384 target, large enough that one call costs more than the loop
# around it, and a 4 x 192 draft (a fifth of its cost) distilled from it for 800 steps; float16 files
# keep the repository small. Earlier 6 x 384 targets were undertrained (lr 1.5e-3, 450 steps) or learned
# slower than their draft (3e-3); a 400-step distillation accepted only 0.52. See weights/README.md.
TARGET = GPT2Config(n_layer=6, n_head=6, n_embd=384, n_positions=CONTEXT, vocab_size=VOCAB, eos_token_id=0)
DRAFT = GPT2Config(n_layer=4, n_head=3, n_embd=192, n_positions=CONTEXT, vocab_size=VOCAB, eos_token_id=0)
TARGET_LR, DRAFT_LR = 1e-3, 3e-3
STORED = np.float16  # the dtype of the bundled files: half of float32's bytes; the models run in float32


def as_stored(model):
    """The model (or EAGLE head) exactly as its file will hold it: every later figure is of the shipped weights."""
    rounded = jax.tree_util.tree_map(lambda x: x.astype(STORED).astype(jnp.float32), model.params)
    return dataclasses.replace(model, params=rounded)


def batch_logits(params, config, x):  # [B, T] -> [B, T, V], picospec's own forward pass
    model = fastpath.fast(Model(config, params))
    return jax.vmap(lambda tokens: forward(model, tokens, init_cache(config, tokens.shape[0]))[0])(x)


@partial(jax.jit, static_argnums=1)  # inside jit, each fresh cache is a temporary, not a donated input
def loss_fn(params, config, x, y_probs=None):
    """Cross-entropy of the next token: against the text, or against a teacher's distribution."""
    logprobs = jax.nn.log_softmax(batch_logits(params, config, x[:, :-1]))  # [B, T, V]
    if y_probs is None:
        return -jnp.take_along_axis(logprobs, x[:, 1:, None], axis=-1).mean()
    return -(y_probs * logprobs).sum(-1).mean()


def adamw(lr: float, steps: int):
    """The optimizer of the pair and of the EAGLE head: AdamW (weight decay 0.01) on gradients clipped at
    norm 1, the rate warmed up over the first 5% of the steps, then cosine-decayed to lr / 10."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(steps // 20, 1), steps, lr / 10)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))


def train(config, tokens, steps, seed, lr, teacher: Model | None = None, batch=32, log=print):
    params, optimizer = init_params(config, jax.random.key(seed)), adamw(lr, steps)
    opt_state = optimizer.init(params)

    @jax.jit
    def step(params, opt_state, x):  # soft: for distillation, the target's next-token distribution
        soft = None if teacher is None else jax.nn.softmax(batch_logits(teacher.params, teacher.config, x[:, :-1]))
        loss, grads = jax.value_and_grad(loss_fn)(params, config, x, soft)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng, t0 = np.random.default_rng(seed), time.time()
    for i in range(steps):
        starts = rng.integers(0, len(tokens) - CONTEXT - 1, batch)  # random windows of CONTEXT + 1 tokens
        x = np.stack([tokens[s:s + CONTEXT + 1] for s in starts])  # [batch, CONTEXT + 1]
        params, opt_state, loss = step(params, opt_state, jnp.asarray(x))
        if i % 50 == 0 or i == steps - 1:
            log(f"  step {i:5d}/{steps}  loss {float(loss):.3f}  {time.time() - t0:6.0f}s")
    return fastpath.fast(Model(config, params))


def perplexity(model: Model, tokens: np.ndarray) -> float:
    """exp(mean held-out cross-entropy) over consecutive windows."""
    windows = np.stack([tokens[s:s + CONTEXT + 1] for s in range(0, len(tokens) - CONTEXT, CONTEXT)])
    chunks = [jnp.asarray(windows[i:i + 16]) for i in range(0, len(windows), 16)]
    losses = [float(loss_fn(model.params, model.config, chunk)) for chunk in chunks]
    return float(np.exp(np.average(losses, weights=[len(chunk) for chunk in chunks])))


def acceptance(draft, target, prompts, temperature: float, K=4, n_tokens=64, seed=0) -> tuple[float, np.ndarray]:
    """The acceptance rate (accepted drafts / drafted) over speculative runs on held-out prompts (prompt i
    continued by n_tokens, with key seed + i), and the drafts each iteration accepted [iterations]."""
    counts = []
    for i, prompt in enumerate(prompts):
        _, trace = speculative_sample(draft, target, list(prompt), n_tokens, jax.random.key(seed + i), K=K,
                                      temperature=temperature)
        counts.append(np.asarray(trace.n_accepted[:int(trace.n_steps)]))
    counts = np.concatenate(counts)
    return float(counts.sum() / (K * len(counts))), counts


def main(argv=None):
    from picospec.tools.train import head  # it trains with this module's adamw and acceptance
    parser = argparse.ArgumentParser(prog="python -m picospec.tools.train", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("weights"), help="where tiny-draft/ and tiny-target/ go")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target-steps", type=int, default=600)
    parser.add_argument("--draft-steps", type=int, default=800)
    parser.add_argument("--target-from", type=Path, default=None, help="a tiny-target folder an earlier run with the "
                        "same --seed and --target-steps wrote: use it instead of training the target again (training "
                        "is deterministic; this skips the hour it takes)")
    parser.add_argument("--drafts", choices=["distilled", "text", "both"], default="distilled",
                        help="which drafts to train: distilled from the target (the bundled one), on the "
                             "text, or both, keeping the one with the higher acceptance rate")
    parser.add_argument("--head", action="store_true", help="train an EAGLE head against the bundled tiny-target "
                        "instead, into OUT/tiny-head (tools/train/head.py)")
    parser.add_argument("--head-steps", type=int, default=head.STEPS)
    args = parser.parse_args(argv)
    t0 = time.time()
    log = lambda msg: print(f"[{time.time() - t0:6.0f}s] {msg}", flush=True)  # noqa: E731
    if args.head:
        return head.main(args.out, args.seed, args.head_steps, log)

    train_text, held_text = corpus()
    tokenizer = train_tokenizer(train_text)
    train_tokens, held_tokens = (np.array(tokenizer.encode(text).ids, np.int32) for text in (train_text, held_text))
    log(f"corpus: {len(train_tokens):,} training tokens, {len(held_tokens):,} held out")

    if args.target_from:
        log(f"the target from {args.target_from}")
        target = as_stored(load_model(args.target_from, "float32"))
        if target.config != TARGET:
            raise SystemExit(f"picospec.tools.train: {args.target_from} is not a "
                             f"{TARGET.n_layer} x {TARGET.n_embd} target")
    else:
        log("training the target")
        target = as_stored(train(TARGET, train_tokens, args.target_steps, args.seed, TARGET_LR, log=log))
    save_checkpoint(target, tokenizer, args.out / "tiny-target", STORED)  # now, so --target-from can reuse it
    drafts = {}
    for kind, teacher, how in [("text", None, "on the text"), ("distilled", target, "by distillation from the target")]:
        if args.drafts in ("both", kind):
            log(f"training a draft {how}")
            drafts[f"draft ({kind})"] = as_stored(train(DRAFT, train_tokens, args.draft_steps, args.seed + 1, DRAFT_LR,
                                                        teacher, log=log))

    rng = np.random.default_rng(args.seed)
    prompts = [held_tokens[s:s + 32] for s in rng.integers(0, len(held_tokens) - 32, 20)]
    report = {"seed": args.seed, "target_from": str(args.target_from) if args.target_from else None,
              "target_steps": args.target_steps, "draft_steps": args.draft_steps,
              "learning_rates": {"target": TARGET_LR, "draft": DRAFT_LR}, "stored": np.dtype(STORED).name,
              "corpus": "King James Bible (Debian bible-kjv), every 20th chapter held out",
              "training_tokens": len(train_tokens), "held_out_tokens": len(held_tokens), "models": {}}
    for name, model in [("target", target), *drafts.items()]:
        entry = {"params": sum(x.size for x in jax.tree_util.tree_leaves(model.params)),
                 "config": config_json(model.config), "held_out_perplexity": perplexity(model, held_tokens)}
        if model is not target:
            for temperature in (0.0, 1.0):
                entry[f"acceptance_T{temperature:g}_K4"] = acceptance(model, target, prompts, temperature)[0]
        report["models"][name] = entry
        log(f"{name}: {json.dumps({k: v for k, v in entry.items() if k != 'config'})}")

    kept = max(drafts, key=lambda name: sum(report["models"][name][f"acceptance_T{t}_K4"] for t in ("0", "1")))
    report |= {"kept_draft": kept, "train_seconds": round(time.time() - t0)}
    save_checkpoint(drafts[kept], tokenizer, args.out / "tiny-draft", STORED)
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    write_heldout_sample(held_text, args.out / "heldout_sample.txt")
    log(f"kept {kept}; wrote {args.out}/tiny-target, {args.out}/tiny-draft, {args.out}/training_report.json")
