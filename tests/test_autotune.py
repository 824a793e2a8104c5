"""--K auto's tuner (picospec/tools/autotune/): costs from laps of the run's own compiled programs, their
shape, their spread and rounding, the prior the laps see, and what is kept between runs."""

import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import DATA, random_model

import picospec
from picospec.beyond.adaptive import AdaptiveDraft
from picospec.beyond.loop import Trace
from picospec.beyond.policy import Policy, choose_k
from picospec.sampling import Sampling
from picospec.tools import autotune, cli
from picospec.tools.autotune import cost_model, laps
from picospec.tools.cli import options
from picospec.tools.cli.stream import warm

PAIR = ["--draft", str(DATA / "tiny-prefixed"), "--target", str(DATA / "tiny-hub")]


def test_timed_costs_never_fall_as_k_grows_and_stay_closest_to_the_laps():
    """A noisy lap that times k = 6 below k = 5 is pooled with it (least squares), not left to make a
    longer draft look cheaper; monotone costs are kept as they are."""
    timed = [1.3, 3.0, 3.4, 3.5, 4.3, 4.5, 4.2, 4.8]
    smooth = cost_model.never_less(timed)
    assert all(a <= b for a, b in zip(smooth, smooth[1:])) and smooth[5] == smooth[6] == pytest.approx(4.35)
    assert smooth[:5] == timed[:5] and smooth[7] == timed[7] and sum(smooth) == pytest.approx(sum(timed))
    assert cost_model.never_less([3.0, 2.0, 1.0]) == [2.0, 2.0, 2.0]  # the control: all pooled, a cumulative max is not
    assert np.maximum.accumulate([3.0, 2.0, 1.0]).tolist() != cost_model.never_less([3.0, 2.0, 1.0])


def iteration_shaped(c: float) -> list:
    """v(0..7) with K_max = 7's blocks (4 and 8 positions) and each draft adding c: the shape cost_model fits."""
    return [1.0] + [2.0 + c * k + (1.0 if k >= 4 else 0) for k in range(1, 8)]


def test_timed_costs_take_the_shape_of_an_iteration():
    """Within one block the target scores (k + 1 <= 4, 8 at K_max = 7), each draft adds the same c: costs
    of that shape are kept as they are, the k between a block's ends follow from the fit, and a lap that timed
    k = 7 10% slow is spread over the k that share c (the control: never_less alone keeps the slow lap)."""
    shaped = iteration_shaped(0.3)
    assert cost_model.worth_timing(7) == [0, 3, 4, 7] and cost_model.worth_timing(3) == [0, 1, 3]
    timed = [x if k in cost_model.worth_timing(7) else np.nan for k, x in enumerate(shaped)]
    np.testing.assert_allclose(cost_model.per_block(timed), shaped)
    slow = shaped[:7] + [shaped[7] * 1.1]
    fitted = cost_model.never_less(cost_model.per_block(slow))
    assert np.abs(np.subtract(fitted, shaped)).max() < 0.7 * abs(slow[7] - shaped[7]) and fitted[0] == shaped[0]
    assert cost_model.never_less(slow) == slow


def fake_laps(monkeypatch, seconds):
    """(the laps' calls by k, a timed(k) for laps.costs): seconds(k, r) is what a lap of k takes in round r (0:
    the first laps, not counted; a round laps k = 0, every other timed k, and k = 0 again)."""
    calls, per_round = {}, len(cost_model.worth_timing(7)) + 1

    def timed(k):
        r = sum(calls.values()) // per_round
        calls[k] = calls.get(k, 0) + 1
        return seconds(k, r)
    monkeypatch.setattr(laps, "SECONDS", 0.0)  # the fewest rounds
    return calls, timed


def test_costs_are_the_fastest_laps_over_the_target_alone_whatever_slows_them(monkeypatch):
    """Every k's fastest lap over k = 0's, so a machine that runs 2.5x slower in one round, or one lap 3x
    slow, changes nothing (the control: means of the same laps would); rounded up to 1/32; the first lap
    of each k prepares it and is not counted; each k >= 1 raised by the rounds' spread, none here."""
    slowdown = [1.0, 2.5, 1.0, 1.3]  # a round's machine speed, every lap of it alike
    shaped = iteration_shaped(0.3)
    seconds = lambda k, r: 1e-3 * shaped[k] * (9.0 if r == 0 else slowdown[r - 1] * (3 if (k, r) == (7, 2) else 1))  # noqa: E731
    calls, timed = fake_laps(monkeypatch, seconds)
    found = laps.costs(timed, 7)
    assert calls == {k: (2 + 2 * laps.MIN_ROUNDS) if k == 0 else 1 + laps.MIN_ROUNDS for k in cost_model.worth_timing(7)}
    assert found["v"] == [np.ceil(x * 32 - 1e-6) / 32 for x in shaped] and found["spread"] == 0
    assert found["ms"] == pytest.approx(1.0) and found["rounds"] == laps.MIN_ROUNDS
    means = {k: np.mean([seconds(k, r) for r in range(1, 5)]) for k in (0, 7)}
    assert abs(means[7] / means[0] - shaped[7]) > 0.2  # the control


def test_ratios_that_move_between_rounds_raise_drafting_by_their_spread(monkeypatch):
    """Drafting must win by more than the timing can tell: ratios that differ round to round by +-10% of
    the target's step (the even rounds' fastest laps against the odd rounds' 0.2 apart) add 0.2 / sqrt(2)
    to every k >= 1, never to k = 0."""
    shaped, wobble = iteration_shaped(0.3), [0.1, -0.1, 0.1, -0.1]
    found = laps.costs(fake_laps(monkeypatch, lambda k, r: 1e-3 * (shaped[k] + (wobble[r - 1] if k and r else 0.0)))[1], 7)
    spread = 0.2 / np.sqrt(2)
    assert found["spread"] == pytest.approx(spread, abs=1e-4) and found["v"][0] == 1.0
    fastest = [x - 0.1 for x in shaped[1:]]  # each k's fastest lap: its -0.1 rounds
    assert found["v"][1:] == [np.ceil((x + found["spread"]) * 32 - 1e-6) / 32 for x in fastest]


def report(beta, n_accepted, k, ran):
    """(which rows ran, their rows) of a lap's report, as laps.evidence reads them: [n, B] fields."""
    n, B, K = beta.shape
    zeros = np.zeros((n, B, K))
    rows = Trace(zeros.astype(int), np.int32(k), np.int32(n_accepted), zeros[..., 0], zeros, zeros, zeros, zeros,
                 zeros, np.float32(beta), 0, np.ones((n, B, 2), bool))
    return np.bool_(ran), rows


def test_the_prior_is_what_the_laps_drafts_were_judged_after_their_first_iteration():
    """Each judged draft (up to and with the first rejection) counts its beta as successes and 1 - beta as
    failures, a row's share; a row's first iteration (one token of context) and iterations that did not
    run count nothing; more than PRIOR judged drafts count as PRIOR."""
    beta = np.float32([[[0.1, 0.1, 0.1]], [[0.9, 0.5, 0.2]], [[1.0, 1.0, 1.0]], [[0.3, 0.3, 0.3]]])  # [4, 1, 3]
    s, f = laps.evidence(*report(beta, [[3], [1], [3], [0]], [[3], [3], [3], [3]], [[True], [True], [True], [False]]))
    assert (s, f) == pytest.approx((0.9 + 0.5 + 3.0, 0.1 + 0.5))  # iteration 1: d_0, d_1 judged; 2: all three
    many = laps.evidence(*report(np.full((40, 2, 3), 0.75, np.float32), np.full((40, 2), 3), np.full((40, 2), 3),
                                np.ones((40, 2), bool)))
    assert many == pytest.approx((0.75 * laps.PRIOR, 0.25 * laps.PRIOR))  # 117 judged a row: capped


def test_warming_up_runs_every_block_size_auto_may_score():
    """The stream prepares each branch of score_first's switch at start-up: warm runs the iteration once
    with the policy forced to k = 3 and 7 (blocks of 4 and 8 positions) when K_max = 7."""
    chosen = []
    draft = AdaptiveDraft(None, Policy(jnp.float32(0), jnp.ones(8, jnp.float32), jnp.float32(0)))
    warm(lambda models, *rest: chosen.append(int(choose_k(models[0].policy, 0.0, 0.0))), draft, None, {},
                None, None)
    assert chosen == [3, 7]


def auto_run(capsys, *flags):
    assert cli.main([*PAIR, "--prompt", "The quick", "--n-tokens", "12", "--K", "auto", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_auto_times_its_own_programs_once_and_decides_alike_from_what_it_kept(capsys, tmp_path, monkeypatch,
                                                                              compiles):
    """A first --K auto run times the CLI's compiled iterations and keeps the costs in costs.json (v(0) = 1,
    never falling, steps of 1/32); a repeated run reads them (timing again fails the test) and, with the
    same prior from its laps, drafts the same k and writes the same tokens. --json shows what it decided from.
    Either run prepares every block size before its clock starts (a repeated run runs no laps that would), and
    tuning compiles nothing of its own: it runs the programs compiled already (a small jnp operation is one more)."""
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", str(tmp_path / "jit"))
    monkeypatch.setattr(options, "AUTO_K_MAX", 3)  # less to compile here
    tune, compiled_in_tune = autotune.tune, []

    def counted(*args):
        before = compiles.count
        tuned = tune(*args)
        compiled_in_tune.append(compiles.count - before)
        return tuned
    monkeypatch.setattr(autotune, "tune", counted)
    first = auto_run(capsys, "--temperature", "0.8")
    assert compiled_in_tune == [0]
    (kept,) = json.loads((tmp_path / "jit" / "costs.json").read_text()).values()
    v = kept["v"]
    assert len(v) == 4 and v[0] == 1.0 and v == sorted(v) and all(x * 32 == int(x * 32) for x in v)
    monkeypatch.setattr(laps, "costs", lambda *args: pytest.fail("timed again"))
    stream_module, warmed = importlib.import_module("picospec.tools.cli.stream"), []
    monkeypatch.setattr(stream_module, "warm", lambda *args: warmed.append(args) or warm(*args))
    again = auto_run(capsys, "--temperature", "0.8")
    assert len(warmed) == 1
    assert again["tokens"] == first["tokens"] and [s["k"] for s in again["steps"]] == [s["k"] for s in first["steps"]]
    said = again["stats"]["auto"]
    assert said["costs"] == v and said["spread"] == kept["spread"] and len(said["prior"]) == 2
    assert sum(said["prior"]) > 0  # the laps judged drafts: the prior is theirs


def test_auto_says_in_json_what_it_chose_and_why():
    """--K auto's report: iterations of each k (k = 0 where the target stepped alone), the acceptance seen
    (accepted over judged: up to and with the first rejection), and what it decided from: the prior, the
    costs, their spread and k = 0's time; whether it stopped."""
    from picospec.tools.cli.steps import Step
    tuned = {"v": [1.0, 1.5, 1.75], "spread": 0.03, "ms": 2.5, "prior": (3.0, 1.0), "prefill": 0.5, "rounds": 4}
    steps = [Step([1, 2, 3], drafted=[1, 2], accepted=2, bonus=True, k=2), Step([4], drafted=[5, 6], accepted=0, k=2),
             Step([7], drafted=[8], accepted=0, k=1), Step([9], proposed=False)]
    said = autotune.explain(tuned, steps)
    assert said["k_chosen"] == {"0": 1, "1": 1, "2": 2} and said["stopped"]
    assert said["acceptance_seen"] == pytest.approx(2 / 4)  # judged: 2, 1 and 1
    assert said["prior"] == [3.0, 1.0] and said["costs"] == [1.0, 1.5, 1.75] and said["ms"] == 2.5
    assert not autotune.explain(tuned, steps[:3])["stopped"]


@pytest.mark.slow  # 12 s: the stream's programs compiled for two pairs (test_adaptive.py stops a prior in the fast suite)
def test_a_prior_from_the_laps_can_stop_drafting_before_the_first_call_and_stays_exact(monkeypatch):
    """The laps of a draft the target never agrees with judge failures: with costs where drafting pays only
    if alpha is high, its policy never drafts, and greedy output stays the target's (the choice of k looks
    only at the past). The control: the target as its own draft, whose laps judge successes, drafts."""
    monkeypatch.setattr(options, "AUTO_K_MAX", 3)
    monkeypatch.setattr(laps, "costs", lambda *args: {"v": [1.0, 1.8, 2.0, 2.2], "spread": 0.0, "prefill": 0.8,
                                                      "ms": 1.0, "rounds": 0})
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", "off")
    target = random_model(seed=3, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    unrelated = random_model(seed=9, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    prompt, greedy = [1, 4, 2, 7, 3, 0], Sampling(0.0)
    doubtful = autotune.policy_for(unrelated, target, [prompt], 20, greedy)
    assert float(doubtful.prior[1]) > 2 * float(doubtful.prior[0])
    out, trace = picospec.speculative_sample(unrelated, target, prompt, 20, jax.random.key(0), K=3, temperature=0,
                                             policy=doubtful)
    assert not np.asarray(trace.k[:int(trace.n_steps)]).any()  # never drafted
    np.testing.assert_array_equal(out, picospec.autoregressive_sample(target, prompt, 20, jax.random.key(0), temperature=0))
    sure = autotune.policy_for(target, target, [prompt], 20, greedy)
    assert float(sure.prior[1]) == 0 and float(sure.prior[0]) > 0
    _, trace = picospec.speculative_sample(target, target, prompt, 20, jax.random.key(0), K=3, temperature=0, policy=sure)
    assert np.asarray(trace.k[:2]).all()


def test_the_librarys_policy_is_timed_on_the_librarys_own_loop_and_kept(monkeypatch, tmp_path):
    """policy_for's laps are runs of the library's sampler, the policy forced to k: k = 0 never drafts (the
    target alone), k = 3 drafts 3 a call; the costs they give are the policy's, kept in costs.json, and a
    prompt of another length with the same --n-tokens reads them (timing again fails the test)."""
    monkeypatch.setenv("PICOSPEC_JIT_CACHE", str(tmp_path))
    target = random_model(seed=3, vocab_size=16, n_layer=2, n_positions=128, std=0.3)
    draft = random_model(seed=9, vocab_size=16, n_layer=1, n_positions=128, std=0.3)
    drafted, costs = {}, {"v": [1.0, 1.5, 1.75, 2.0, 2.5, 2.75, 3.0, 3.25], "spread": 0.0, "prefill": 0.5, "ms": 1.0,
                          "rounds": 0}
    run = picospec.tools.samplers.speculative_sample

    def recording(*args, **kwargs):  # the laps' runs: what each drafted a call
        out, trace = run(*args, **kwargs)
        forced = int(np.argmin(np.asarray(kwargs["policy"].v)))  # the k the run was forced to
        drafted.setdefault(forced, set()).update(np.asarray(trace.k[:int(trace.n_steps)]).tolist())
        return out, trace
    monkeypatch.setattr(picospec.tools.samplers, "speculative_sample", recording)

    def laps_of(timed, K):  # k = 0 and 3 in turn, as laps.costs runs them
        assert K == options.AUTO_K_MAX and timed(0) > 0 and timed(3) > 0
        return costs
    monkeypatch.setattr(laps, "costs", laps_of)
    policy = autotune.policy_for(draft, target, [[1, 4, 2, 7]], 20, Sampling(0.8))
    assert drafted == {0: {0}, 3: {3}, 7: {7}}  # the laps, and the prior's run drafting K_max
    assert np.asarray(policy.v).tolist() == costs["v"] and float(policy.prefill) == 0.5
    monkeypatch.setattr(laps, "costs", lambda *args: pytest.fail("timed again"))
    again = autotune.policy_for(draft, target, [[1, 4, 2, 7, 3, 5]], 20, Sampling(0.8))
    assert np.asarray(again.v).tolist() == costs["v"]
