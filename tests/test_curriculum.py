"""The curriculum on synthetic losses: the bandit's arithmetic, its schedule, bounds, warm-up,
resume, the plot; and the training config that builds it."""

import itertools
import json
import math
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from andrea.curriculum import Curriculum, clamp_weights, progress_reward_and_ema, reward_and_ema
from andrea.errors import AndreaError
from andrea.plots import plot_curriculum
from andrea.trainconfig import TrainConfig, apply_overrides


def improving_loss(name: str, pulls: int, noise: random.Random | None = None) -> float:
    """`improving` gets better every time it is trained on; every other source stays flat."""
    base = 3.0 * 0.995 ** pulls if name == "improving" else 3.0
    return base + (noise.gauss(0.0, 0.02) if noise else 0.0)


def run(cur: Curriculum, steps, loss=improving_loss, check=None) -> list[str]:
    """Drive `cur` for `steps`; each source's loss depends only on how often it was pulled."""
    picked = []
    for step in steps:
        source = cur.next_source(step)
        if check:
            check(cur, step, source)
        cur.update(source, loss(source, cur.pulls[source]))
        picked.append(source)
    return picked


# ---------------------------------------------------------------- the arithmetic


def test_reward_and_ema_match_hand_computed_values():
    cur = Curriculum(["a", "b"], C=2.0)
    # first observation: EMA = loss, reward 0
    assert cur.update("a", 4.0) == 0.0 and cur.ema["a"] == 4.0
    # reward (4.0 - 3.0) * 1000; EMA 0.9 * 4.0 + 0.1 * 3.0
    assert cur.update("a", 3.0) == pytest.approx(1000.0) and cur.ema["a"] == pytest.approx(3.9)
    assert cur.update("a", 3.5) == pytest.approx(400.0) and cur.ema["a"] == pytest.approx(3.86)
    # a worse loss earns nothing (max with 0) but still moves the EMA
    assert cur.update("a", 4.0) == 0.0 and cur.ema["a"] == pytest.approx(3.874)
    assert cur.mean_rewards()["a"] == pytest.approx(350.0)
    assert cur.ucb_scores()["b"] == math.inf  # unpulled
    cur.update("b", 2.0)
    scores = cur.ucb_scores()  # N = 5 pulls; a has 4, b has 1
    assert scores["a"] == pytest.approx(350.0 + 2.0 * math.sqrt(math.log(5) / 4))
    assert scores["b"] == pytest.approx(0.0 + 2.0 * math.sqrt(math.log(5) / 1))
    assert reward_and_ema(None, 7.0) == (0.0, 7.0)


def test_weights_are_proportional_to_ucb_at_a_reroll():
    cur = Curriculum(["a", "b", "c"], C=1.0, reroll=(1, 1))  # re-roll every step
    run(cur, range(30))
    cur.next_source(30)
    scores = cur.ucb_scores()
    total = sum(scores.values())
    for s, w in cur.weights.items():
        assert w == pytest.approx(scores[s] / total)


def test_unpulled_sources_are_pulled_first():
    cur = Curriculum(["a", "b", "c"], seed=3)
    assert run(cur, range(3), loss=lambda s, n: 1.0) == ["a", "b", "c"]


def test_an_improving_source_is_pulled_more_than_a_flat_one():
    noise = random.Random(0)
    cur = Curriculum(["flat", "improving", "also-flat"], seed=1)
    picked = run(cur, range(600), loss=lambda s, n: improving_loss(s, n, noise))
    share = picked.count("improving") / len(picked)
    assert share > 0.7, share
    assert cur.mean_rewards()["improving"] > 5 * cur.mean_rewards()["flat"]
    # the uniform baseline on the same losses does not favour it
    uniform = run(Curriculum(["flat", "improving", "also-flat"], seed=1, mode="uniform"), range(600),
                  loss=lambda s, n: improving_loss(s, n, noise))
    assert 0.25 < uniform.count("improving") / 600 < 0.42


# ---------------------------------------------------------------- floors, caps, warm-up


def test_floors_and_caps_hold_at_every_step():
    floors, caps = {"b": 0.1, "c": 0.15}, {"improving": 0.4, "d": 0.3}
    cur = Curriculum(["improving", "b", "c", "d"], floors=floors, caps=caps, seed=2)
    seen = []

    def check(cur, step, source):
        w = cur.weights
        assert sum(w.values()) == pytest.approx(1.0, abs=1e-12)
        for s, x in w.items():
            assert floors.get(s, 0.0) - 1e-12 <= x <= caps.get(s, 1.0) + 1e-12, (step, w)
        seen.append(w["improving"])

    picked = run(cur, range(500), check=check)
    assert max(seen) == pytest.approx(0.4)  # the cap is what held it back
    assert picked.count("improving") / 500 < 0.5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=6))
def test_clamp_weights_holds_bounds_sums_to_one_and_stays_proportional(rows):
    n = len(rows)
    raw = {str(i): r for i, (r, _, _) in enumerate(rows)}
    floors = {str(i): f / n for i, (_, f, _) in enumerate(rows)}  # floors sum to <= 1
    caps = {str(i): max(floors[str(i)], c) for i, (_, _, c) in enumerate(rows)}
    assume(sum(caps.values()) >= 1.0)
    w = clamp_weights(raw, floors, caps)
    assert sum(w.values()) == pytest.approx(1.0, abs=1e-9)
    for k in raw:
        assert floors[k] - 1e-9 <= w[k] <= caps[k] + 1e-9
    # the weights strictly inside their bounds keep the raw weights' proportions
    inside = [k for k in raw if floors[k] + 1e-9 < w[k] < caps[k] - 1e-9 and raw[k] > 0]
    ratios = [w[k] / raw[k] for k in inside]
    assert max(ratios, default=0) == pytest.approx(min(ratios, default=0), rel=1e-6)


def test_clamp_weights_redistributes_what_the_caps_take():
    assert clamp_weights({"a": 8, "b": 1, "c": 1}, {}, {"a": 0.5}) == pytest.approx({"a": 0.5, "b": 0.25, "c": 0.25})
    assert clamp_weights({"a": 1, "b": 0}, {"b": 0.2}, {}) == pytest.approx({"a": 0.8, "b": 0.2})


@pytest.mark.parametrize("kwargs, words", [
    (dict(floors={"a": 0.6, "b": 0.6}), "floors"),
    (dict(caps={"a": 0.3, "b": 0.3, "c": 0.3}), "caps"),
    (dict(floors={"a": 0.5}, caps={"a": 0.4}), "floor <= cap"),
    (dict(floors={"z": 0.1}), "unknown source"),
    (dict(warmup_sources=["a"], warmup_steps=10, caps={"a": 0.5}), "warm-up"),
    (dict(warmup_steps=10), "warm-up source"),
    (dict(reroll=(0, 5)), "reroll"),
    (dict(mode="greedy"), "mode"),
])
def test_impossible_settings_are_refused(kwargs, words):
    with pytest.raises(AndreaError, match=words):
        Curriculum(["a", "b", "c"], **kwargs)


def test_only_warmup_sources_are_pulled_during_warmup():
    cur = Curriculum(["a", "b", "c"], warmup_sources=["b", "c"], warmup_steps=50, seed=4)

    def check(cur, step, source):
        if step < 50:
            assert source in ("b", "c") and cur.weights["a"] == 0.0
    picked = run(cur, range(200), check=check)
    assert picked[50] == "a"  # opened at step 50, and pulled first because it never was
    assert 50 in cur.rerolls  # the weights were re-rolled when it opened
    assert "a" in picked[50:] and cur.weights["a"] > 0


# ---------------------------------------------------------------- the schedule and resume


def test_reroll_intervals_lie_in_7_to_42():
    cur = Curriculum(["a", "b"], seed=5)
    run(cur, range(3000))
    gaps = [b - a for a, b in zip(cur.rerolls, cur.rerolls[1:])]
    assert all(7 <= g <= 42 for g in gaps)
    assert min(gaps) <= 9 and max(gaps) >= 40  # spread over the whole range
    cur = Curriculum(["a", "b"], seed=5, reroll=(3, 5))
    run(cur, range(300))
    assert {b - a for a, b in zip(cur.rerolls, cur.rerolls[1:])} == {3, 4, 5}


def test_same_seed_same_schedule_and_another_seed_another():
    def schedule(seed, mode="ucb"):
        return run(Curriculum(["a", "improving", "c"], seed=seed, mode=mode), range(300))
    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)
    assert schedule(7, "uniform") == schedule(7, "uniform")


@pytest.mark.parametrize("mode", ["ucb", "uniform"])
def test_restored_state_continues_the_identical_schedule(mode):
    kwargs = dict(floors={"b": 0.1}, caps={"improving": 0.7}, warmup_sources=["b"], warmup_steps=20, seed=9, mode=mode)
    whole = Curriculum(["improving", "b", "c"], **kwargs)
    expected = run(whole, range(400))

    first = Curriculum(["improving", "b", "c"], **kwargs)
    head = run(first, range(137))
    state = json.loads(json.dumps(first.state_dict()))  # as it travels in a checkpoint
    resumed = Curriculum(["improving", "b", "c"], **kwargs)
    resumed.load_state_dict(state)
    tail = run(resumed, range(137, 400))

    assert head + tail == expected
    assert resumed.weights == whole.weights and resumed.rerolls == whole.rerolls
    assert resumed.history == whole.history


def test_state_of_other_sources_is_refused():
    state = Curriculum(["a", "b"]).state_dict()
    with pytest.raises(AndreaError, match="sources"):
        Curriculum(["a", "c"]).load_state_dict(state)


@pytest.mark.hostile
def test_a_reroll_beyond_any_run_is_refused():
    cur = Curriculum(["a", "b"], seed=0)
    run(cur, range(10))
    state = cur.state_dict()
    for value in (2**70, 2**62, -1, 1.5):
        with pytest.raises(AndreaError, match="next_reroll"):
            Curriculum(["a", "b"]).load_state_dict({**state, "next_reroll": value})
    Curriculum(["a", "b"]).load_state_dict({**state, "next_reroll": 2**40})  # far, but a count: clamped to a reroll


def test_bad_updates_are_refused():
    cur = Curriculum(["a", "b"])
    with pytest.raises(AndreaError, match="unknown source"):
        cur.update("z", 1.0)
    with pytest.raises(AndreaError, match="finite"):
        cur.update("a", float("nan"))


def test_history_records_each_step():
    cur = Curriculum(["a", "improving"], seed=0)
    picked = run(cur, range(50))
    h = cur.history
    assert [r["step"] for r in h] == list(range(50)) and [r["source"] for r in h] == picked
    assert all(abs(sum(r["weights"].values()) - 1) < 1e-12 for r in h)
    assert h[1]["reward"] == 0.0 and h[1]["loss"] == 3.0  # first pull of each source


def test_plot_curriculum_writes_a_png(tmp_path):
    import matplotlib.image

    cur = Curriculum(["a", "improving", "c"], caps={"improving": 0.6}, seed=0)
    run(cur, range(150))
    path = tmp_path / "curriculum.png"
    plot_curriculum(cur.history, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(path).shape[:2]
    assert width > 200 and height > 200
    with pytest.raises(AndreaError, match="empty"):
        plot_curriculum([], tmp_path / "none.png")


# ---------------------------------------------------------------- the training config


def test_training_config_round_trips_and_builds_the_curriculum(tmp_path):
    cfg = TrainConfig(sources=["a", {"name": "b", "path": "data/b.txt", "floor": 0.1, "cap": 0.5}],
                      curriculum={"warmup_sources": ["a"], "warmup_steps": 10}, audit={"threshold": 20}, seed=3)
    assert cfg.sources[0] == {"name": "a", "path": "a", "floor": 0.0, "cap": 1.0}
    assert cfg.audit == {"every": 100, "tokens": 420, "threshold": 20, "patience": 5, "enabled": True}
    assert cfg.curriculum["reroll"] == [7, 42] and cfg.sampling == "ucb"
    cfg.save(tmp_path / "train.json")
    assert TrainConfig.load(tmp_path / "train.json") == cfg
    cur = cfg.make_curriculum()
    assert (cur.sources, cur.floors, cur.caps, cur.warmup_steps, cur.seed) == (["a", "b"], {"b": 0.1}, {"b": 0.5}, 10, 3)


def test_training_config_names_unknown_fields_and_bad_values(tmp_path):
    with pytest.raises(AndreaError, match="bogus, colour"):
        TrainConfig.from_dict({"bogus": 1, "colour": 2, "lr": 1e-3})
    with pytest.raises(AndreaError, match="unknown audit setting.*every_n"):
        TrainConfig.from_dict({"audit": {"every_n": 5}})
    with pytest.raises(AndreaError, match="unknown source field.*weight"):
        TrainConfig.from_dict({"sources": [{"name": "a", "weight": 2}]})
    with pytest.raises(AndreaError, match="floors"):
        TrainConfig.from_dict({"sources": [{"name": "a", "floor": 0.7}, {"name": "b", "floor": 0.7}]})
    with pytest.raises(AndreaError, match="recipe"):
        TrainConfig.from_dict({"recipe": "v4"})
    with pytest.raises(AndreaError, match="batch_size"):
        TrainConfig.from_dict({"batch_size": 0})
    with pytest.raises(AndreaError, match="reroll"):
        TrainConfig.from_dict({"curriculum": {"reroll": [10, 5]}})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(AndreaError, match="not valid JSON"):
        TrainConfig.load(tmp_path / "bad.json")


def test_flags_override_only_the_fields_they_give():
    cfg = TrainConfig(max_steps=100, lr=1e-3, audit={"patience": 3})
    new = apply_overrides(cfg, max_steps=50, lr=None, seed=None, audit_threshold=10.0, curriculum_warmup_steps=0,
                          sampling="uniform")
    assert (new.max_steps, new.lr, new.seed, new.sampling) == (50, 1e-3, cfg.seed, "uniform")
    assert new.audit["threshold"] == 10.0 and new.audit["patience"] == 3
    assert cfg.max_steps == 100 and cfg.audit["threshold"] == 30.0  # the original is untouched
    with pytest.raises(AndreaError, match="no_such_flag"):
        apply_overrides(cfg, no_such_flag=1)
    with pytest.raises(AndreaError, match="batch_size"):
        apply_overrides(cfg, batch_size=-4)


# ---------------------------------------------------------------- reward "progress"


def test_progress_reward_matches_hand_computed_values():
    cur = Curriculum(["a", "b"], C=2.0, reward="progress")
    assert cur.update("a", 4.0) == 0.0 and cur.ema["a"] == 4.0
    # (4.0 - 3.0) / 4.0 in percent; EMA 0.9 * 4.0 + 0.1 * 3.0 = 3.9
    assert cur.update("a", 3.0) == pytest.approx(25.0) and cur.ema["a"] == pytest.approx(3.9)
    # a worse loss is a negative reward: (3.9 - 4.29) / 3.9
    assert cur.update("a", 4.29) == pytest.approx(-10.0) and cur.ema["a"] == pytest.approx(3.939)
    # the recent mean: 0, then 0.95 * 0 + 0.05 * 25, then 0.95 * 1.25 + 0.05 * -10
    assert cur.mean_rewards()["a"] == pytest.approx(0.95 * 1.25 - 0.5)
    cur.update("b", 2.0)
    assert cur.ucb_scores()["a"] == pytest.approx(0.6875 + 2.0 * math.sqrt(math.log(4) / 3))
    assert progress_reward_and_ema(None, 7.0) == (0.0, 7.0)


def test_progress_reward_does_not_depend_on_the_loss_scale():
    """The same relative progress earns the same reward on a source whose loss is 3x another's;
    ANDREA's reward pays the larger loss 3x."""
    losses = [4.0, 3.8, 3.7, 3.65, 3.6]
    for reward, same in (("progress", True), ("andrea", False)):
        cur = Curriculum(["small", "large"], reward=reward)
        for x in losses:
            cur.update("small", x)
            cur.update("large", 3 * x)
        means = cur.mean_rewards()
        assert (means["large"] == pytest.approx(means["small"])) is same, (reward, means)


def test_progress_reward_does_not_pay_for_noise():
    """A flat, noisy source: ANDREA's reward (max with 0) is paid on every lucky batch and grows
    with the noise; the signed progress reward averages to about zero."""
    noise = random.Random(5)
    cur = {r: Curriculum(["noisy"], reward=r) for r in ("andrea", "progress")}
    for _ in range(2000):
        x = 3.0 + noise.gauss(0.0, 0.1)
        for c in cur.values():
            c.update("noisy", x)
    andrea_mean = cur["andrea"]._reward_sum[0] / 2000
    progress_sum = cur["progress"]._reward_sum[0] / 2000  # the all-time mean of the signed rewards
    assert andrea_mean > 30  # about 1000 * E[max(0, noise)], paid for nothing learned
    assert abs(progress_sum) < 0.1


def test_progress_reward_favours_an_improving_source_and_forgets_early_drops():
    noise = random.Random(0)
    cur = Curriculum(["flat", "improving", "also-flat"], seed=1, reward="progress", C=0.5)
    picked = run(cur, range(600), loss=lambda s, n: improving_loss(s, n, noise))
    assert picked.count("improving") / len(picked) > 0.5
    # once a source stops improving its recent mean falls back toward zero
    cur2 = Curriculum(["a"], reward="progress")
    for n in range(100):
        cur2.update("a", 3.0 * 0.98 ** n)
    high = cur2.mean_rewards()["a"]
    for _ in range(200):
        cur2.update("a", 3.0 * 0.98 ** 99)
    assert high > 1.0 and cur2.mean_rewards()["a"] < 0.1 * high


def test_progress_state_resumes_and_mismatched_reward_is_refused():
    kwargs = dict(seed=4, reward="progress", reroll=(2, 5))
    a = Curriculum(["x", "improving", "y"], **kwargs)
    run(a, range(40))
    b = Curriculum(["x", "improving", "y"], **kwargs)
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert run(a, range(40, 120)) == run(b, range(40, 120))
    with pytest.raises(AndreaError, match="reward"):
        Curriculum(["x", "improving", "y"], seed=4).load_state_dict(a.state_dict())
    with pytest.raises(AndreaError, match="reward must be one of"):
        Curriculum(["x"], reward="greedy")
    assert TrainConfig(curriculum={"reward": "progress"}).curriculum_kwargs()["reward"] == "progress"


# ---------------------------------------------------------------- reward "abs-progress"


def test_abs_progress_scores_the_size_of_the_recent_mean():
    cur = Curriculum(["a", "b"], C=2.0, reward="abs-progress")
    for x in (4.0, 3.0, 4.29):  # rewards 0, 25, -10 as in the "progress" test above
        cur.update("a", x)
    assert cur.history[-1]["reward"] == pytest.approx(-10.0)  # each reward keeps its sign
    cur.update("b", 2.0)
    cur.update("b", 2.2)  # (2.0 - 2.2) / 2.0: -10%, so b's recent mean is 0.95 * 0 - 0.5
    assert cur.mean_rewards() == pytest.approx({"a": 0.6875, "b": 0.5})
    assert cur.ucb_scores()["b"] == pytest.approx(0.5 + 2.0 * math.sqrt(math.log(5) / 2))
    assert TrainConfig(curriculum={"reward": "abs-progress"}).curriculum_kwargs()["reward"] == "abs-progress"


def forgetting_run(reward: str, steps: int = 1500) -> list[str]:
    """Two sources the model keeps learning, and one ("learned") whose loss rises with every step
    it is not drawn and falls back when it is: a source being forgotten."""
    cur = Curriculum(["improving-1", "learned", "improving-2"], seed=3, reward=reward)
    noise, last = random.Random(2), {}
    picked = []
    for step in range(steps):
        s = cur.next_source(step)
        if s == "learned":
            loss = 2.0 + 0.01 * min(step - last.get(s, step), 100)
        else:
            loss = 3.0 * 0.998 ** cur.pulls[s] + noise.gauss(0.0, 0.02)
        last[s] = step
        cur.update(s, loss)
        picked.append(s)
    return picked


def test_a_source_being_forgotten_is_shut_out_by_progress_and_drawn_again_by_abs_progress():
    """Under "progress", forgetting is a negative reward: the source's score falls below zero, its
    weight to 0, and a source never drawn never changes its mean. Under "abs-progress" it is drawn
    on through the run."""
    signed, absolute = forgetting_run("progress"), forgetting_run("abs-progress")
    late = slice(750, None)
    assert signed[late].count("learned") < 0.02 * 750
    assert absolute[late].count("learned") > 0.1 * 750
    gaps = [j - i for i, j in itertools.pairwise([n for n, s in enumerate(absolute) if s == "learned"])]
    assert max(gaps) < 50
