"""Small pure pieces: WSD schedule, parameter split, clipping, caption sampling, time shift."""

from __future__ import annotations

import itertools

import torch

from krea2.dit.model import Krea2DiT
from krea2.trainer.captions import choose_caption
from krea2.trainer.config import OptimizerConfig, OptimizerName, ScheduleConfig, ScheduleDecay
from krea2.trainer.objective import draw_time_and_noise, sample_generator, weighted_loss
from krea2.trainer.optim import build_optimizers, clip_grad_norm, split_parameters
from krea2.trainer.schedule import in_stable_phase, wsd_factor
from krea2.trainer.testing import blob_captions


def test_wsd_warms_up_holds_and_decays_without_reaching_zero():
    cfg = ScheduleConfig(warmup_steps=10, decay_ratio=0.2, decay=ScheduleDecay.LINEAR)
    f = [wsd_factor(s, 100, cfg) for s in range(100)]
    assert f[0] == 0.1 and f[9] == 1.0
    assert all(x == 1.0 for x in f[10:80])
    assert all(a > b for a, b in itertools.pairwise(f[80:]))
    assert 0 < f[-1] < 0.06
    assert in_stable_phase(50, 100, cfg) and not in_stable_phase(85, 100, cfg)


def test_wsd_cosine_and_sqrt_reach_the_floor_shape():
    for decay in (ScheduleDecay.COSINE, ScheduleDecay.SQRT):
        cfg = ScheduleConfig(warmup_steps=0, decay_ratio=1.0, decay=decay, min_lr_factor=0.1)
        f = [wsd_factor(s, 50, cfg) for s in range(50)]
        assert f[0] < 1.0 and 0.1 <= f[-1] < 0.2 and sorted(f, reverse=True) == f


def test_muon_split_is_exhaustive_disjoint_and_keeps_io_layers_on_adamw():
    model = Krea2DiT.from_config("tiny")
    named = [(f"dit.{n}", p) for n, p in model.named_parameters()]
    groups = split_parameters(named, muon=True)
    seen = [n for g in groups.values() for n, _ in g]
    assert sorted(seen) == sorted(n for n, _ in named)  # exhaustive and disjoint
    muon = {n for n, _ in groups["muon"]}
    assert "dit.blocks.0.attn.wq.weight" in muon and "dit.blocks.1.mlp.down.weight" in muon
    assert "dit.txtfusion.refiner_blocks.0.attn.wo.weight" in muon
    for n in (
        "dit.first.weight",
        "dit.last.linear.weight",
        "dit.tmlp.0.weight",
        "dit.txtmlp.1.weight",
    ):
        assert n not in muon
    assert all(p.ndim == 2 for _, p in groups["muon"])
    assert {n for n, _ in groups["norms"]} >= {"dit.blocks.0.prenorm.scale", "dit.txtmlp.0.scale"}
    assert "dit.blocks.0.mod.lin" in {n for n, _ in groups["no_decay"]}


def test_build_optimizers_muon_uses_nesterov_and_rms_matching():
    model = Krea2DiT.from_config("tiny")
    cfg = OptimizerConfig(name=OptimizerName.MUON, lr=2e-3, norm_weight_decay=0.01)
    opts = build_optimizers([(f"dit.{n}", p) for n, p in model.named_parameters()], cfg, 2e-3)
    adamw, muon = opts
    assert isinstance(muon, torch.optim.Muon)
    g = muon.param_groups[0]
    assert g["nesterov"] and g["adjust_lr_fn"] == "match_rms_adamw" and g["lr"] == 2e-3
    norms = next(g for g in adamw.param_groups if g["name"] == "norms")
    assert norms["weight_decay"] == 0.01


def test_clip_grad_norm_matches_torch():
    a = torch.nn.Linear(4, 3)
    (a(torch.randn(5, 4)).square().sum() * 10).backward()
    ref = torch.nn.utils.get_total_norm([p.grad for p in a.parameters()])
    total = clip_grad_norm(list(a.parameters()), 0.5)
    assert abs(total - float(ref)) < 1e-5
    after = torch.nn.utils.get_total_norm([p.grad for p in a.parameters()])
    assert abs(float(after) - 0.5) < 1e-4


def test_caption_formats_follow_their_weights_and_dropout():
    caps = blob_captions(1, 4)
    weights = {"long": 0.5, "short": 0.5, "json": 0.0}
    g = torch.Generator().manual_seed(0)
    draws = [choose_caption(caps, weights, 0.2, g) for _ in range(4000)]
    empty = sum(d == "" for d in draws) / len(draws)
    long = sum(d == caps[0]["text"] for d in draws) / len(draws)
    short = sum(d == caps[2]["text"] for d in draws) / len(draws)
    assert abs(empty - 0.2) < 0.03 and abs(long - 0.4) < 0.03 and abs(short - 0.4) < 0.03
    assert set(draws) <= {"", caps[0]["text"], caps[2]["text"]}  # json weight 0: never


def test_caption_falls_back_when_weighted_formats_are_missing():
    g = torch.Generator().manual_seed(0)
    only_tags = [{"format": "tags", "text": "red, disc"}]
    assert choose_caption(only_tags, {"long": 1.0}, 0.0, g) == "red, disc"
    assert choose_caption([], {"long": 1.0}, 0.0, g) == ""


def test_time_shift_moves_t_towards_noise():
    gens = lambda: [sample_generator(0, 0, i) for i in range(2000)]  # noqa: E731
    t0, _ = draw_time_and_noise(gens(), (1,), mu=0.0)
    t1, _ = draw_time_and_noise(gens(), (1,), mu=1.15)
    assert abs(float(t0.mean()) - 0.5) < 0.03
    assert float(t1.mean()) > float(t0.mean()) + 0.1
    assert float(t0.min()) > 0 and float(t1.max()) < 1


def test_sample_randomness_depends_on_the_sample_not_the_rank_split():
    a = sample_generator(3, 17, 5)
    b = sample_generator(3, 17, 5)
    assert torch.equal(torch.randn(4, generator=a), torch.randn(4, generator=b))
    assert not torch.equal(
        torch.randn(4, generator=sample_generator(3, 17, 6)),
        torch.randn(4, generator=sample_generator(3, 17, 5)),
    )


def test_weighted_loss_ignores_padding_and_matches_global_mean():
    per = torch.tensor([1.0, 2.0, 3.0, 100.0])
    w = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert float(weighted_loss(per, w, w.sum(), dp=1)) == 2.0
    # Two ranks: their losses average (as FSDP averages gradients) to the global mean.
    r0 = weighted_loss(per[:2], w[:2], w.sum(), dp=2)
    r1 = weighted_loss(per[2:], w[2:], w.sum(), dp=2)
    assert float((r0 + r1) / 2) == 2.0


def test_latent_cache_encodes_each_key_once_and_evicts_the_oldest():
    from krea2.trainer.cache import LatentCache

    calls = []

    def enc(x):
        calls.append(x.shape[0])
        return x * 2

    cache = LatentCache(3)
    x = torch.arange(4.0).view(4, 1, 1, 1)
    assert torch.equal(cache.encode(["a", "b"], x[:2], enc), x[:2] * 2)
    assert torch.equal(cache.encode(["b", "c"], x[1:3], enc), x[1:3] * 2)
    assert calls == [2, 1] and cache.hits == 1
    cache.encode(["d"], x[3:], enc)  # evicts "a", the least recently used
    cache.encode(["a"], x[:1], enc)
    assert calls == [2, 1, 1, 1]
