"""The bug zoo: the ways speculative samplers are known to go wrong, each as a small mutation of
picospec's own code, and the test of the suite that catches it (the test ids read "bug -> test").

Every bug here changes the output law while a greedy test may still pass. Each mutation patches one
function of the lesson for the length of one test; the catching test is the suite's own, unchanged:
  the draft's draws   test_speculative: each drafted token is the inverse-CDF draw from the p it reports
  one step's law      test_speculative: one rejection step emits q (chi-square, 20,000 draws)
  the loop's law      test_speculative: the first three tokens of the whole loop follow the target
  greedy identity     test_speculative: at temperature 0 the output is the target's own greedy output
  the trace           test_speculative: every recorded p and q is the models' own, recomputed from scratch
One mutation is not a bug here: a residual left unnormalized, because `sample` draws u times the total
mass of what it is given; the zoo shows that the law tests pass with it.
"""

import jax
import jax.numpy as jnp
import pytest
import test_speculative as suite

from picospec import speculative
from picospec.beyond import loop, verifiers
from picospec.beyond.loop import Verdict
from picospec.sampling import Sampling, sample
from picospec.tools import samplers

ORIGINAL_PROPOSE, ORIGINAL_SAMPLE, ORIGINAL_RULE = speculative.propose, speculative.sample, speculative.accept_or_resample
ORIGINAL_ADVANCE, ORIGINAL_STEP = speculative.advance, loop.speculative_step  # the step the public API runs


def bfloat16(x):  # x rounded as bfloat16 would hold it (XLA may drop a float32 -> bfloat16 -> float32 round trip)
    return jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)


def top_two(probs):  # [..., V] -> [..., V]: the two most likely tokens, renormalized
    kept = jnp.where(probs >= jnp.sort(probs, axis=-1)[..., -2:-1], probs, 0.0)
    return kept / kept.sum(-1, keepdims=True)


def draws_with(draw):
    """A mutation of step 1: the draft draws its tokens with `draw`, and reports the p it computed."""
    def propose(*args):
        speculative.sample = draw  # read when propose is traced, then put back
        try:
            return ORIGINAL_PROPOSE(*args)
        finally:
            speculative.sample = ORIGINAL_SAMPLE
    return lambda m: m.setattr(speculative, "propose", propose)


def reports(edit):
    """A mutation of step 1: the draft draws from its p, but reports edit(p)."""
    def propose(*args):
        proposal = ORIGINAL_PROPOSE(*args)
        return proposal._replace(p=edit(proposal.p))
    return lambda m: m.setattr(speculative, "propose", propose)


def draft_ignores_temperature(m):  # z-lab/dflash#74: drawn at T = 1, while the ratio uses p at T
    def propose(draft, tokens, n, cache, key, K, sampling):
        proposal = ORIGINAL_PROPOSE(draft, tokens, n, cache, key, K, Sampling(1.0, sampling.top_k, sampling.top_p))
        p = proposal.p ** (1 / sampling.temperature)  # what p at T would have been
        return proposal._replace(p=p / p.sum(-1, keepdims=True))
    m.setattr(speculative, "propose", propose)


def rule(verify):
    """A mutation of steps 3 and 4: the token rule replaced by `verify`, wherever it is looked up."""
    def apply(m):
        m.setattr(speculative, "accept_or_resample", verify)
        m.setitem(verifiers.RULES, "token", verify)
    return apply


def equality_accepts(key_accept, key_extra, drafted, p, q, greedy=False):  # ml-explore/mlx-swift-lm#459
    """A draft kept when it equals the target's own sample, then the token rule's residual."""
    t = jax.vmap(lambda key, q_i: sample(key, q_i, greedy))(jax.random.split(key_accept, len(drafted)), q[:-1])
    a = jnp.sum(jnp.cumprod(t == drafted))
    p_padded = jnp.concatenate([p, jnp.zeros_like(p[:1])])
    extra = sample(key_extra, speculative.residual(q[a], p_padded[a]), greedy)
    return Verdict(a, extra, speculative.at(p, drafted), speculative.at(q, drafted))


def bonus_one_position_early(key_accept, key_extra, drafted, p, q, greedy=False):
    """After K accepts, the bonus drawn from q[K-1], the last draft's position, not q[K]."""
    verdict = ORIGINAL_RULE(key_accept, key_extra, drafted, p, q, greedy)
    early = sample(key_extra, q[len(drafted) - 1], greedy)
    return verdict._replace(extra=jnp.where(verdict.n_accepted == len(drafted), early, verdict.extra))


def one_uniform(key_accept, key_extra, drafted, p, q, greedy=False):
    """The acceptance coins and the resample drawn from the same key."""
    return ORIGINAL_RULE(key_accept, key_accept, drafted, p, q, greedy)


def unnormalized(q, p):  # max(0, q - p) as it is: sample() scales its uniform by the total
    return jnp.maximum(q - p, 0.0)


def one_key_for_every_iteration(m):
    def step(draft, target, state, *args, **kwargs):
        return ORIGINAL_STEP(draft, target, state, *args, **kwargs)._replace(key=state.key)
    m.setattr(samplers, "speculative_step", step)


def no_draft_rollback(m):
    def advance(state, proposal, verdict, target_cache, eos_id):
        return ORIGINAL_ADVANCE(state, proposal, verdict, target_cache, eos_id)._replace(draft_cache=proposal.cache)
    m.setattr(speculative, "advance", advance)


CATCHERS = {
    "the draft's draws": lambda: suite.test_each_drafted_token_is_the_inverse_cdf_draw_from_the_p_it_reports(0.5),
    "one step's law": lambda: suite.test_rejection_step_output_law_is_the_target("random"),
    "the loop's law": lambda: suite.test_first_three_tokens_follow_the_target_joint_law(dict(K=2, temperature=1.0)),
    "greedy identity": lambda: suite.test_greedy_speculative_equals_greedy_target(3),
    "the trace": suite.test_trace_probabilities_are_the_models_own,
}
ZOO = {  # bug: (mutation, the test that catches it)
    "the draft ignores temperature": (draft_ignores_temperature, "the draft's draws"),
    "the draft draws from bfloat16 logits": (draws_with(lambda key, probs, greedy=False: ORIGINAL_SAMPLE(
        key, jax.nn.softmax(bfloat16(jnp.log(probs))), greedy)), "the draft's draws"),  # deepseek-ai/DeepSpec#31
    "acceptance by token equality": (rule(equality_accepts), "one step's law"),
    "an argmax draft, its p in the ratio": (draws_with(lambda key, probs, greedy=False: jnp.argmax(probs)),
                                            "the draft's draws"),  # jaymody/speculative-sampling#3
    "top-k in the draft's draw, not its p": (draws_with(lambda key, probs, greedy=False: ORIGINAL_SAMPLE(
        key, top_two(probs), greedy)), "the draft's draws"),
    "top-k in the draft's p, not its draw": (reports(top_two), "the draft's draws"),
    "the residual taken as q": (rule(suite.wrong_accept_or_resample), "one step's law"),
    "the bonus from the last draft's q": (rule(bonus_one_position_early), "greedy identity"),
    "one uniform for accept and resample": (rule(one_uniform), "one step's law"),
    "one key for every iteration": (one_key_for_every_iteration, "the loop's law"),
    "the draft's cache not rolled back": (no_draft_rollback, "the trace"),
}
SLOW = {"the bonus from the last draft's q", "one key for every iteration", "the draft's cache not rolled back"}


def run_mutated(mutation, catcher: str):
    """The catching test with the mutation applied; jax's caches cleared so that it is traced anew."""
    with pytest.MonkeyPatch.context() as m:
        mutation(m)
        jax.clear_caches()
        try:
            CATCHERS[catcher]()
        finally:
            jax.clear_caches()


@pytest.mark.parametrize("bug", [b if b not in SLOW else pytest.param(b, marks=pytest.mark.slow) for b in ZOO],
                         ids=lambda bug: f"{bug} -> {ZOO[bug][1]}")
def test_the_suite_catches(bug):
    mutation, catcher = ZOO[bug]
    with pytest.raises(AssertionError):
        run_mutated(mutation, catcher)


def test_an_unnormalized_residual_is_no_bug_here():
    """sample() draws u times the total mass, so max(0, q - p) left unnormalized draws the same tokens."""
    run_mutated(lambda m: m.setattr(speculative, "residual", unnormalized), "one step's law")  # passes
    key, r = jax.random.key(0), jnp.array([0.0, 0.1, 0.3, 0.05])
    assert all(int(sample(k, r)) == int(sample(k, r / r.sum())) for k in jax.random.split(key, 200))
