"""The GRPO/DiffusionNFT pieces on their own: the SDE transition and its log-probability,
the importance ratio of a recomputed step, advantages (sum and GDPO), the losses, the
prompt-pool verdicts, the artifact gate and the settings' checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from krea2.dit import flow
from krea2.infra.errors import UserError
from krea2.rl.online import (
    GrpoConfig,
    OldPolicy,
    advantages,
    artifact_alarm,
    background_noise,
    curate_pool,
    export_prompt_shards,
    gate_rewards,
    gaussian_kl,
    group_z,
    grpo_terms,
    log_prob,
    nft_terms,
    nft_terms_adaptive,
    noise_alarm,
    optimality,
    reason_counts,
    sde_rollout,
    step_log_prob,
    training_pool,
    transition,
)
from krea2.rl.online.advantage import batch_moments, gdpo_sum


class TinyVelocity(torch.nn.Module):
    """A conv net v(x, t) with a time input: enough to make the ratio test non-trivial."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * (1 + t.view(-1, 1, 1, 1))


def test_transition_is_the_sde_euler_maruyama_step_and_euler_without_noise():
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(2, 3, 4, 4, generator=g), torch.randn(2, 3, 4, 4, generator=g)
    t, t_next, sigma = 0.6, 0.5, 0.4
    mean, std = transition(x, v, t, t_next, sigma)
    # drift v + σ²/(2t)(x + (1-t)v) integrated backwards over Δ = 0.1
    expect = x - 0.1 * (v + sigma**2 / (2 * t) * (x + (1 - t) * v))
    torch.testing.assert_close(mean, expect)
    assert std == pytest.approx(sigma * math.sqrt(0.1))
    euler, zero = transition(x, v, t, t_next, 0.0)
    torch.testing.assert_close(euler, x + (t_next - t) * v)  # krea2.dit's euler_step
    assert zero == 0.0


def test_the_sde_keeps_the_flow_marginals_for_a_gaussian():
    # data ~ N(0, s0²): x_t ~ N(0, (1-t)² s0² + t²), v*(x, t) = E[ε - x0 | x] in closed form
    s0, n = 0.5, 3000
    times = flow.sampling_times(20, 0.0)

    def velocity(x, t):
        tt = t.view(-1, 1, 1, 1).double()
        var = (1 - tt) ** 2 * s0**2 + tt**2
        return ((tt - (1 - tt) * s0**2) / var * x.double()).float()

    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    noise = torch.randn(n, 1, 1, 1, generator=torch.Generator().manual_seed(1))
    ro = sde_rollout(velocity, noise, times, range(1, 19), 0.8, gens)
    assert float(ro.x0.std()) == pytest.approx(s0, rel=0.08)


def test_log_prob_is_the_gaussian_density_averaged_over_elements():
    g = torch.Generator().manual_seed(1)
    mean, x = torch.randn(3, 2, 4, 4, generator=g), torch.randn(3, 2, 4, 4, generator=g)
    expect = torch.distributions.Normal(mean, 0.3).log_prob(x).flatten(1).mean(1)
    torch.testing.assert_close(log_prob(x, mean, 0.3), expect)


@pytest.mark.numerics  # the first ratio is 1 to 1e-6 under every kernel choice
def test_recomputed_log_prob_gives_ratio_one_on_the_first_step_and_moves_after_an_update():
    net = TinyVelocity()
    times = flow.sampling_times(6, 0.5)
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    noise = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(9))
    ro = sde_rollout(net, noise, times, [1, 2, 3], 0.7, gens)
    assert ro.window == [1, 2, 3] and ro.log_probs.shape == (3, 4)
    for k in range(3):
        logp, _ = step_log_prob(net, ro, k, slice(0, 4))
        assert logp.requires_grad
        ratio = torch.exp(logp - ro.log_probs[k])
        assert float((ratio.detach() - 1).abs().max()) <= 1e-6
    with torch.no_grad():
        net.conv.weight.add_(0.05)
    logp, _ = step_log_prob(net, ro, 0, slice(0, 4))
    assert float((torch.exp(logp.detach() - ro.log_probs[0]) - 1).abs().max()) > 1e-4


def test_rollouts_of_a_row_do_not_depend_on_its_batch():
    net = TinyVelocity()
    times = flow.sampling_times(4, 0.5)
    noise = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    full = sde_rollout(net, noise, times, [0, 1], 0.7,
                       [torch.Generator().manual_seed(i) for i in range(4)])  # fmt: skip
    half = sde_rollout(net, noise[2:], times, [0, 1], 0.7,
                       [torch.Generator().manual_seed(i) for i in (2, 3)])  # fmt: skip
    torch.testing.assert_close(full.x0[2:], half.x0, rtol=1e-5, atol=1e-6)


def test_sum_and_gdpo_advantages():
    easy = np.array([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    hard = np.array([[0.0, 0.0, 0.01, 0.0], [0.0, 0.02, 0.0, 0.0]])
    w = {"easy": 1.0, "hard": 1.0}
    s = advantages({"easy": easy, "hard": hard}, w, "sum")
    np.testing.assert_allclose(s, group_z(easy + hard))
    # under the sum the hard reward barely moves prompt 0's advantages; under GDPO its
    # ranking counts as much as the easy one's
    g = advantages({"easy": easy, "hard": hard}, w, "gdpo")
    pre = group_z(easy) + group_z(hard)
    np.testing.assert_allclose(g, (pre - pre.mean()) / pre.std())
    assert g[0, 2] - g[0, 1] > 0.5 and s[0, 2] - s[0, 1] < 0.05
    assert g[1, 1] > g[1, 0]  # prompt 1: the easy reward is flat, the hard one decides
    np.testing.assert_allclose(group_z(np.ones((2, 3))), 0.0)


def test_gdpo_batch_moments_over_ranks_equal_the_whole_batch():
    rng = np.random.default_rng(0)
    r = {"a": rng.random((6, 4)), "b": rng.random((6, 4))}
    w = {"a": 1.0, "b": 0.5}
    whole = advantages(r, w, "gdpo")
    parts = [{k: v[:3] for k, v in r.items()}, {k: v[3:] for k, v in r.items()}]
    moments = np.sum([batch_moments(gdpo_sum(p, w)) for p in parts], axis=0)
    split = np.concatenate([advantages(p, w, "gdpo", tuple(moments)) for p in parts])
    np.testing.assert_allclose(split, whole)
    with pytest.raises(ValueError, match="no weight"):
        advantages(r, {"a": 1.0}, "sum")


def test_grpo_terms_clip_the_ratio_on_the_side_of_the_advantage():
    logp_old = torch.zeros(4)
    logp = torch.log(torch.tensor([1.0, 1.5, 0.5, 1.5]))
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    loss, ratio, clipped = grpo_terms(logp, logp_old, adv, clip=0.2)
    # A > 0: gain capped at 1.2; A < 0: the loss keeps the larger ratio's penalty
    torch.testing.assert_close(loss, torch.tensor([-1.0, -1.2, 0.8, 1.5]))
    torch.testing.assert_close(clipped, torch.tensor([0.0, 1.0, 1.0, 1.0]))
    torch.testing.assert_close(ratio, torch.tensor([1.0, 1.5, 0.5, 1.5]))


def test_gaussian_kl_and_nft_gradient_direction():
    m, m_ref = torch.ones(2, 1, 2, 2), torch.zeros(2, 1, 2, 2)
    torch.testing.assert_close(gaussian_kl(m, m_ref, 0.5), torch.full((2,), 2.0))
    target = torch.zeros(3, 1, 2, 2)
    v_old = torch.ones(3, 1, 2, 2)
    v = v_old.clone().requires_grad_(True)
    r = torch.tensor([1.0, 0.5, 0.0])
    nft_terms(v, v_old, target, r, beta=1.0).sum().backward()
    # at v = v_old the gradient is 2β(2r − 1)(v − target) / elements: pull, none, push
    expect = 2 * (2 * r - 1).view(-1, 1, 1, 1) * (v_old - target) / 4
    torch.testing.assert_close(v.grad, expect)
    np.testing.assert_allclose(optimality(np.array([-3.0, 0.0, 0.5, 9.0])), [0, 0.5, 0.75, 1])


def test_adaptive_nft_weighting_is_the_velocity_loss_scaled_per_sample_and_time():
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.randn(3, 2, 4, 4, generator=g), torch.randn(3, 2, 4, 4, generator=g)
    t = torch.tensor([0.2, 0.5, 0.9])
    x_t, target = flow.interpolate(x0, eps, t), flow.velocity_target(x0, eps)
    v_old = target + 0.3 * torch.randn(3, 2, 4, 4, generator=g)
    v = v_old + 0.1 * torch.randn(3, 2, 4, 4, generator=g)
    one, half = torch.ones(3), torch.full((3,), 0.5)
    # r = 1, β = 1: x̂0 = x_t − t v, so ‖x̂0 − x0‖² = t² ‖v − target‖², over t mean|v − target|
    rows = nft_terms_adaptive(v, v_old, x_t, t, x0, one, beta=1.0)
    scale = t / (v - target).abs().flatten(1).mean(1)
    torch.testing.assert_close(rows, nft_terms(v, v_old, target, one, beta=1.0) * scale)
    # at v = v_old and r = 1/2 the pull and the push cancel: no gradient, as unweighted
    v = v_old.clone().requires_grad_(True)
    nft_terms_adaptive(v, v_old, x_t, t, x0, half, beta=1.0).sum().backward()
    torch.testing.assert_close(v.grad, torch.zeros_like(v))


def test_old_policy_soft_update_swap_and_its_pull_in_the_nft_loss():
    lin = torch.nn.Linear(3, 2)
    w0 = lin.weight.detach().clone()
    old = OldPolicy(list(lin.parameters()))
    with torch.no_grad():
        lin.weight.add_(1.0)
    old.update(0.75)  # old = 0.75 w0 + 0.25 (w0 + 1)
    torch.testing.assert_close(old.old[0], w0 + 0.25)
    x = torch.randn(4, 3)
    with old.swapped_in():
        torch.testing.assert_close(lin(x), x @ (w0 + 0.25).T + lin.bias)
    assert torch.equal(lin.weight, w0 + 1.0)  # the trained weights come back bit for bit
    with old.swapped_in():  # again, through the buffer kept from the first swap
        assert torch.equal(lin.weight, w0 + 0.25)
    assert torch.equal(lin.weight, w0 + 1.0)
    copy = OldPolicy(list(lin.parameters()))
    copy.load_state_dict(old.state_dict())
    assert torch.equal(copy.old[0], old.old[0])
    old.update(0.0)
    assert torch.equal(old.old[0], lin.weight)
    with pytest.raises(ValueError, match="decay"):
        old.update(1.0)
    # a lagging v_old adds 2β²(v − v_old) / elements: the pull back to the sampling policy
    target, v_old = torch.zeros(2, 1, 2, 2), torch.zeros(2, 1, 2, 2)
    v = torch.ones(2, 1, 2, 2, requires_grad=True)
    nft_terms(v, v_old, target, torch.tensor([0.5, 0.5]), beta=0.5).sum().backward()
    torch.testing.assert_close(v.grad, 2 * 0.25 * (v.detach() - v_old) / 4)


def test_pool_verdicts_and_their_reasons():
    scores = np.array([[1, 1, 1], [0, 0, 0], [0.5, 0.5, 0.5], [0, 0.5, 1]], np.float64)
    recs = curate_pool(["solved", "hopeless", "flat", "useful"], scores)
    assert [r.reason for r in recs] == [
        "always solved", "never solved", "no reward variance", "kept"
    ]  # fmt: skip
    assert reason_counts(recs) == {
        "kept": 1, "always solved": 1, "never solved": 1, "no reward variance": 1
    }  # fmt: skip
    assert recs[3].std == pytest.approx(np.std([0, 0.5, 1]))
    with pytest.raises(ValueError, match="prompts"):
        curate_pool(["a"], scores)
    # the training pool: kept prompts, repeated by how often they fail (up to hard_repeats)
    scores = np.array([[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 1], [0, 1, 1, 1]], np.float64)
    recs = curate_pool(["solved", "hopeless", "hard", "easy"], scores)
    assert training_pool(recs) == ["hard", "easy"]
    assert training_pool(recs, hard_repeats=5) == ["hard"] * 4 + ["easy"] * 2
    assert (
        training_pool(recs, 5, keep_unsolved=True) == ["hopeless"] * 5 + ["hard"] * 4 + ["easy"] * 2
    )
    assert training_pool(recs, 2, keep_solved=True) == ["solved", "hard", "hard", "easy"]
    with pytest.raises(ValueError, match="hard_repeats"):
        training_pool(recs, hard_repeats=0)


def test_artifact_gate_takes_the_gain_of_a_defective_image():
    rubric = np.array([[1.0, 0.5, 0.0]])
    art = np.array([[0.1, 0.9, 0.9]])
    gated = gate_rewards({"rubric": rubric, "artifact": art}, gate=0.5)
    np.testing.assert_allclose(gated["rubric"], [[0.0, 0.5, 0.0]])
    np.testing.assert_allclose(gated["artifact"], art)
    with pytest.raises(ValueError, match="artifact"):
        gate_rewards({"rubric": rubric}, 0.5)


def test_artifact_alarm_is_relative_to_the_first_evaluation():
    # the proof run's numbers: 0.021 at the start, 0.000 ten iterations later
    assert artifact_alarm(0.021, 0.000, 0.5) is not None
    assert artifact_alarm(0.021, 0.015, 0.5) is None
    assert "fell from 0.0210 to 0.0000" in artifact_alarm(0.021, 0.0, 0.5)
    with pytest.raises(ValueError, match="artifact_bound"):
        artifact_alarm(0.5, 0.4, 1.5)


def test_background_noise_sees_the_grid_pattern_and_not_the_objects():
    from krea2.curate import shapes
    from krea2.rl.rewards import grid_defect

    rng = np.random.default_rng(0)
    clean = np.stack([shapes.render(shapes.sample_scene(rng), 64, 64) for _ in range(8)])
    grid = np.stack([grid_defect(img, np.random.default_rng(i)) for i, img in enumerate(clean)])
    flat = np.zeros((1, 64, 64, 3), np.uint8)
    assert background_noise(flat)[0] == 0.0
    assert background_noise(clean).max() < 1.0  # plain backgrounds, object edges masked out
    # even the faintest grid (6 grey levels, half of it clipped on black) more than doubles it
    assert np.all(background_noise(grid) > 2 * background_noise(clean) + 0.5)
    with pytest.raises(ValueError, match="B, H, W, 3"):
        background_noise(clean[0])


def test_noise_alarm_fires_above_its_factor_of_the_first_evaluation():
    # the proof's numbers: 0.51 for the pretrained samples, 8.7 with the grid
    assert noise_alarm(0.51, 8.73, 2.0) is not None
    assert noise_alarm(0.51, 0.9, 2.0) is None
    assert "rose from 0.510 to 8.730" in noise_alarm(0.51, 8.73, 2.0)
    with pytest.raises(ValueError, match="noise_bound"):
        noise_alarm(0.5, 0.4, 1.0)


def test_settings_and_prompt_shards_refuse_bad_input(tmp_path):
    with pytest.raises(ValueError, match="group_size"):
        GrpoConfig(group_size=1)
    with pytest.raises(ValueError, match="window_size"):
        GrpoConfig(window_size=0)
    with pytest.raises(ValueError, match="same rewards"):
        GrpoConfig(rewards={"rubric": "rubric"}, weights={"other": 1.0})
    with pytest.raises(ValueError, match="artifact"):
        GrpoConfig(artifact_gate=0.5)
    with pytest.raises(ValueError, match="noise_bound"):
        GrpoConfig(noise_bound=0.9)
    with pytest.raises(ValueError, match="kl_beta"):
        GrpoConfig(kl_beta=-0.1)
    with pytest.raises(ValueError, match="nft_weighting"):
        GrpoConfig(objective="nft", nft_weighting="x0")
    from krea2.rl.online import RlRunConfig, RlStageSettings

    for bad in ({"hard_repeats": 0}, {"lr_decay_ratio": 1.5}, {"ema_decay": 1.0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RlStageSettings(**bad)
    for bad in ({"lr_decay_ratio": -0.1}, {"ema_decay": -0.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RlRunConfig(**bad)
    with pytest.raises(UserError, match="empty"):
        export_prompt_shards([], tmp_path, 32, 2)
    with pytest.raises(UserError, match="prompt 1 is empty"):
        export_prompt_shards(["a red circle", " "], tmp_path, 32, 2)
    assert not list(tmp_path.iterdir())  # nothing written


def test_the_stage_job_runs_on_the_settings_seed(tmp_path):
    from krea2.rl.online import RlStageSettings
    from krea2.rl.online.stage import stage_job
    from krea2.trainer import JobConfig, StageConfig

    pretrain = JobConfig(seed=3, stages=[StageConfig(name="pretrain", resolution=32)])
    same = stage_job(pretrain, 0, tmp_path / "run", tmp_path / "shards", RlStageSettings(steps=5))
    assert same.seed == 3 and same.stages[-1].steps == 5 and same.stages[-1].name == "rl"
    repeat = stage_job(pretrain, 0, tmp_path / "run", tmp_path / "shards", RlStageSettings(seed=7))
    assert (
        repeat.seed == 7
        and repeat.stages
        == stage_job(pretrain, 0, tmp_path / "run", tmp_path / "shards", RlStageSettings()).stages
    )  # the seed alone differs


def test_aggregations_are_named_as_trl_names_them_and_the_older_names_still_load():
    from krea2.infra.config import ConfigError, build_config
    from krea2.rl.online import Aggregation, GrpoConfig

    assert Aggregation("gdpo") is Aggregation.NORMALIZE_THEN_SUM
    assert Aggregation("sum") is Aggregation.SUM_THEN_NORMALIZE
    old = build_config(GrpoConfig, {"aggregation": "sum"}, "grpo")
    assert old.aggregation is Aggregation.SUM_THEN_NORMALIZE
    with pytest.raises(ConfigError, match=r"grpo\.aggregation.*normalize_then_sum"):
        build_config(GrpoConfig, {"aggregation": "mean"}, "grpo")


def test_the_rl_stage_holds_the_objective_s_own_config_not_a_copy():
    from dataclasses import asdict, fields

    from krea2.rl.online import GrpoConfig, RlStageSettings, settings_with

    stage_fields = {f.name for f in fields(RlStageSettings)}
    copied = stage_fields & {f.name for f in fields(GrpoConfig)}
    assert not copied, f"RlStageSettings repeats GrpoConfig's {sorted(copied)}"
    s = RlStageSettings()
    assert isinstance(s.grpo, GrpoConfig) and s.objective == "nft"
    grpo = settings_with(asdict(s), {"objective": "grpo", "window_size": 2, "steps": 5})
    assert grpo.objective == "grpo" and grpo.steps == 5 and grpo.grpo.window_size == 2
    assert grpo.grpo.weights == s.grpo.weights  # the rest of the objective kept
    with pytest.raises(ValueError, match="the stage's rewards are"):
        RlStageSettings(grpo=GrpoConfig(rewards={"aesthetic": "x"}, weights={"aesthetic": 1.0}))
