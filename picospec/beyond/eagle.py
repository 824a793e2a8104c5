"""EAGLE (Li et al., ICML 2024): a draft that reads the target's own features.

Every draft so far guesses tokens from tokens. EAGLE's head guesses the target's next *feature*, the
vector f_t its LM head reads (GPT-2: the last hidden state, after the final layer norm), from the
features it already has: "autoregression at the feature level is more straightforward than at the
token level". A feature is smooth where a token is a hard choice, and it carries all the target has
worked out about the text so far, so one transformer block extrapolates it well, where a separate draft
model must redo that work with a fraction of the layers. The head here, EAGLE-1's:

  g_t = block(fc([e(x_t), f_{t-1}]))    p(x_{t+1}) = softmax(g_t W), standardized as q is

g_t is the head's guess at f_t; e and W are the target's own (frozen) token embedding and LM head, fc
one linear layer [2C -> C], block one GPT-2 transformer block with its own small KV cache, whose slot s
holds the pair (f_{s-1}, x_s) (f_{-1} = 0). Drafting feeds back its own guesses: after x[n-1], d_0 ~ p
from g_{n-1}, then (g_{n-1}, d_0) gives g_n and d_1, and so on.

Why it stays exact: the head is a draft like any other. It samples d_i ~ p[i] and reports p[i]; the
target scores the drafts in one call and steps 3-5 are Part I's. The verification never asks where p
came from, so the output law is q, whatever the head predicts (a bad head only costs acceptance).

What is new is the flow of features. The target's scoring call already computes f for x[n-1] and each
draft (`score_with_features`); the rows up to the accepted ones are the true features of the new
tokens, kept in the head's cache (`HeadCache.f`). The head's own keys and values for the drafted
slots came from *predicted* features, so step 5 rolls its length back to the true prefix, and the
next iteration's first head call (`catch_up`) feeds the pairs of true features for the tokens just
accepted: 1 to K + 1 of them, fed as K + 1 rows (the rows past the sequence are scratch, beyond the
length), as Part I's catch-up feeds two. Both caches roll back as Part I's do: by moving a length.
With `--K auto` the head drafts the policy's k (on accelerators: K, cut to k), and the target scores the k + 1
positions it needs (score_first.py), handing their features over alike (`adaptive_head_step`); trees: eagle_tree.py.
"""

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from picospec import gpt2
from picospec.beyond.adaptive import AdaptiveDraft, or_target_alone
from picospec.beyond.loop import Proposal, advance
from picospec.beyond.score_first import attention_apart, score_first
from picospec.fastpath import branch_on_cpu
from picospec.gpt2 import GPT2Config, KVCache, Model
from picospec.sampling import Sampling, logits_to_probs, sample
from picospec.speculative import accept_or_resample


class HeadCache(NamedTuple):
    k: list  # 1 x [H, S, D]: the head's keys; slot s from the pair (f_{s-1}, x_s)
    v: list  # 1 x [H, S, D]: and values
    length: jax.Array  # int32 []: slots [0, length) come from the target's true features
    f: jax.Array  # float32 [L + 1, C]: f[s] = f_{s-1}, the target's feature at position s - 1 (f[0] = 0)


@partial(jax.tree_util.register_dataclass, data_fields=["params", "target"], meta_fields=["config"])
@dataclass(frozen=True, eq=False)
class HeadDraft:
    """The EAGLE head, drafting for `target` (set by `for_target`: its embedding and LM head are the head's)."""

    params: dict  # {"fc": {"weight": [C, 2C], "bias": [C]}, "block": one GPT-2 block's params}
    config: GPT2Config  # the target's shape (the head is as wide as the target, with its heads)
    target: Model | None = None
    may_stop = False  # it drafts until the end
    stops_at_k = True  # propose takes --K auto's k

    def for_target(self, target: Model) -> "HeadDraft":
        return HeadDraft(self.params, self.config, target)

    def prefill(self, tokens, n, prefill_len: int, max_len: int) -> HeadCache:
        """The target's features for the prompt (its second pass over it: the loop's prefill of the target
        keeps none), and the head's cache holding the pairs (f_{s-1}, x_s) for s < n - 1."""
        config, dtype = self.config, self.target.params["wte"]["weight"].dtype
        f, _, _ = target_features(self.target, tokens[:prefill_len], gpt2.init_cache(config, prefill_len, dtype))
        empty = jnp.zeros((config.n_head, max_len, config.n_embd // config.n_head), dtype)  # [H, S, D]
        features = jnp.zeros((tokens.shape[0] + 1, config.n_embd)).at[1:prefill_len + 1].set(f)  # [L + 1, C]
        _, _, cache = head_forward(self, features[:prefill_len], tokens[:prefill_len],
                                   HeadCache([empty], [empty], jnp.int32(0), features))
        return cache._replace(length=n - 1)  # slot n - 1's pair is the first iteration's catch-up

    def propose(self, state, key, K: int, sampling: Sampling, k=None) -> Proposal:
        """Step 1: d_0..d_{K-1}, d_i ~ p[i], one head call each (the first also catches up). k (int32 [], `--K
        auto`'s choice): on the CPU the calls stop once d_{k-1} is drawn (adaptive.py cuts the rows past it)."""
        keys, greedy = jax.random.split(key, K), sampling.greedy
        g, p_first, cache = catch_up(self, state.tokens, state.n, state.draft_cache, K, sampling)

        def draft_step(carry, step):  # sample d_i from p[i], feed (g, d_i), get the next feature and p[i+1]
            (cache, g, p_i), (key_i, i) = carry, step
            d_i = sample(key_i, p_i, greedy)

            def feed(cache, g):
                g_next, logits, cache = head_forward(self, g[None], d_i[None], cache)  # [1, C], [1, V]
                return cache, g_next[0], logits_to_probs(logits[0], sampling)
            if k is None:
                return feed(cache, g), (d_i, p_i)
            more = lambda cache, g: jax.lax.cond(i + 1 < k, feed, lambda cache, g: (cache, g, p_i), cache, g)  # noqa: E731
            return branch_on_cpu(more, feed, cache, g), (d_i, p_i)  # elsewhere, all K drafted

        (_, _, p_last), (drafted, p) = jax.lax.scan(draft_step, (cache, g, p_first), (keys[:K - 1], jnp.arange(K - 1)))
        d_last = sample(keys[K - 1], p_last, greedy)
        # The drafted slots came from predicted features: the cache keeps only the true prefix.
        cache = cache._replace(length=state.n)
        return Proposal(jnp.concatenate([drafted, d_last[None]]), jnp.concatenate([p, p_last[None]]), cache, K)


def head_forward(draft: HeadDraft, f, tokens, cache: HeadCache, attend=gpt2.cached_attention):
    """The head on T pairs (f [T, C], tokens [T]) at slots [length, length + T): the predicted next
    features g [T, C], their logits through the target's LM head [T, V], and the cache (training
    attends otherwise: `attend`)."""
    params, config, wte = draft.params, draft.config, draft.target.params["wte"]["weight"]
    matmul = draft.target.matmul
    x = jnp.concatenate([wte[tokens].astype(f.dtype), f], axis=-1)  # [T, 2C]
    x = (matmul(x, params["fc"]["weight"]) + params["fc"]["bias"]).astype(wte.dtype)  # [T, C]
    q_pos = cache.length + jnp.arange(tokens.shape[0])  # [T]
    g, k, v = gpt2.block(x, cache.k[0], cache.v[0], q_pos, **params["block"], n_head=config.n_head,
                         eps=config.layer_norm_epsilon, matmul=matmul, attend=attend)
    g = g.astype(jnp.float32)
    return g, matmul(g, wte), cache._replace(k=[k], v=[v], length=cache.length + tokens.shape[0])


def catch_up(draft: HeadDraft, tokens, n, cache: HeadCache, K: int, sampling: Sampling):
    """The head's first call of an iteration: the pairs (f_{s-1}, x_s) of true features for slots
    s = m..n-1 (m = cache.length; 1 to K + 1 of them, fed as K + 1 rows). Returns g_{n-1} [C] (the row
    of slot n - 1), p[0] [V], and the cache holding n slots."""
    m = cache.length
    f = jax.lax.dynamic_slice(cache.f, (m, 0), (K + 1, cache.f.shape[1]))  # [K+1, C]
    g, logits, cache = head_forward(draft, f, jax.lax.dynamic_slice(tokens, (m,), (K + 1,)), cache)
    return g[n - 1 - m], logits_to_probs(logits[n - 1 - m], sampling), cache._replace(length=n)


def target_features(target: Model, tokens, cache: KVCache, attend=gpt2.cached_attention, positions=None):
    """gpt2.forward that also returns the features its LM head reads: f [T, C] float32, logits [T, V], cache
    (what `attend` returns: score_first's keeps the keys and values apart; a tree's nodes sit at `positions`)."""
    params, config = target.params, target.config
    q_pos = cache.length + jnp.arange(tokens.shape[0]) if positions is None else positions  # [T]
    x = params["wte"]["weight"][tokens] + params["wpe"]["weight"][q_pos]  # [T, C]
    k_all, v_all = [], []
    for layer, k_cache, v_cache in zip(params["h"], cache.k, cache.v):
        x, k, v = gpt2.block(x, k_cache, v_cache, q_pos, **layer, n_head=config.n_head,
                             eps=config.layer_norm_epsilon, matmul=target.matmul, attend=attend)
        k_all.append(k)
        v_all.append(v)
    f = gpt2.layer_norm(x, **params["ln_f"], eps=config.layer_norm_epsilon).astype(jnp.float32)  # [T, C]
    return f, target.matmul(f, params["wte"]["weight"]), KVCache(k_all, v_all, cache.length + tokens.shape[0])


def score_with_features(target: Model, tokens, n, proposal: Proposal, cache: KVCache, sampling: Sampling):
    """Step 2 (speculative.score), keeping the features: q [K+1, V], f [K+1, C] and the target's cache."""
    scored = jnp.concatenate([jax.lax.dynamic_slice(tokens, (n - 1,), (1,)), proposal.drafted])  # [K+1]
    f, logits, cache = target_features(target, scored, cache)
    return logits_to_probs(logits, sampling), f, cache


def head_step(draft: HeadDraft, target: Model, state, K: int, sampling: Sampling, eos_id: int,
              verify=accept_or_resample):
    """One iteration with the head: Part I's, with the target's features handed to the head."""
    key, key_draft, key_accept, key_extra = jax.random.split(state.key, 4)
    proposal = draft.propose(state, key_draft, K, sampling)  # Step 1
    q, f, target_cache = score_with_features(target, state.tokens, state.n, proposal, state.target_cache,
                                             sampling)  # Step 2, with f for x[n-1], d_0, ..., d_{K-1}
    verdict = verify(key_accept, key_extra, proposal.drafted, proposal.p, q, sampling.greedy)  # Steps 3, 4
    # The features of the accepted tokens are true ones: the head's next catch-up reads them.
    features = jax.lax.dynamic_update_slice(proposal.cache.f, f, (state.n, 0))  # f[s] = f_{s-1}
    proposal = proposal._replace(cache=proposal.cache._replace(f=features))
    return advance(state._replace(key=key), proposal, verdict, target_cache, eos_id, proposal.p, q)  # Step 5


def peek_features(target: Model, tokens, cache: KVCache):  # score_first's peek, with f [T, C] for the head
    f, logits, kept_apart = target_features(target, tokens, cache, attend=attention_apart)
    return logits, (kept_apart.k, kept_apart.v), f


def adaptive_head_step(draft: AdaptiveDraft, target: Model, state, K: int, sampling: Sampling, eos_id: int,
                       verify=accept_or_resample):
    """head_step for `--K auto` (adaptive.py: the head wrapped in an AdaptiveDraft drafts K, cut to the
    policy's k): the target scores the k + 1 positions it needs and hands their features over."""
    key, key_draft, key_accept, key_extra = jax.random.split(state.key, 4)
    proposal = draft.propose(state, key_draft, K, sampling)  # Step 1: p's rows past k are zero
    q, target_cache, f = score_first(target, state.tokens, state.n, proposal, state.target_cache, sampling,
                                     draft.agree, least=1, peek=peek_features)  # Step 2: f past row k is padding
    verdict = or_target_alone(verify, draft.agree, key_accept, key_extra, proposal.drafted, proposal.p, q,
                              sampling.greedy)  # Steps 3, 4
    features = jax.lax.dynamic_update_slice(proposal.cache.f, f, (state.n, 0))  # the accepted rows are read next
    proposal = proposal._replace(cache=proposal.cache._replace(f=features))
    return advance(state._replace(key=key), proposal, verdict, target_cache, eos_id, proposal.p, q)  # Step 5


def init_head(config: GPT2Config, key, std: float = 0.02) -> dict:
    """A random head for a target of this shape: fc [C, 2C] starts as (0, I), so g_t starts from f_{t-1}."""
    C = config.n_embd
    block = gpt2.init_params(GPT2Config(n_layer=1, n_head=config.n_head, n_embd=C, n_positions=1, vocab_size=1),
                             key, std)["h"][0]
    return {"fc": {"weight": jnp.concatenate([jnp.zeros((C, C)), jnp.eye(C)], axis=1), "bias": jnp.zeros(C)},
            "block": block}
