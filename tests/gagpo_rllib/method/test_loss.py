"""The GAGPO policy loss against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from gagpo_rllib.method.loss import behaviour_weights, gagpo_policy_loss


def _inputs():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.8, -0.6], [-0.3, -0.9, 0.0]])
    ref = torch.tensor([[-1.2, -2.0, -0.4], [-0.5, -0.7, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.5, -0.8])
    return logp, old, ref, adv, mask


def test_matches_the_formula_by_hand() -> None:
    logp, old, ref, adv, mask = _inputs()
    loss, stats = gagpo_policy_loss(logp, old, ref, adv, mask, clip_eps=0.2, kl_coeff=0.05)
    r0 = math.exp((0.1 - 0.2 + 0.1) / 3)  # length-normalised over the step's 3 tokens
    r1 = math.exp((0.0 + 0.2) / 2)  # the padded third token does not count
    obj0 = min(r0 * 1.5, min(max(r0, 0.8), 1.2) * 1.5)
    obj1 = min(r1 * -0.8, min(max(r1, 0.8), 1.2) * -0.8)
    policy = -(obj0 + obj1) / 2

    def k3(q: float) -> float:
        return math.exp(q) - q - 1

    kl0 = (k3(-0.2) + k3(0.0) + k3(0.1)) / 3
    kl1 = (k3(-0.2) + k3(0.0)) / 2
    kl = (kl0 + kl1) / 2
    assert stats["policy_loss"].item() == pytest.approx(policy, abs=1e-6)
    assert stats["kl"].item() == pytest.approx(kl, abs=1e-6)
    assert loss.item() == pytest.approx(policy + 0.05 * kl, abs=1e-6)
    assert stats["ratio_min"].item() == pytest.approx(min(r0, r1), abs=1e-6)
    assert stats["ratio_max"].item() == pytest.approx(max(r0, r1), abs=1e-6)
    assert stats["clip_fraction"].item() == 0.0


def test_ratio_one_at_the_start() -> None:
    logp, _, ref, adv, mask = _inputs()
    loss, stats = gagpo_policy_loss(logp, logp.detach().clone(), ref, adv, mask, kl_coeff=0.0)
    assert stats["ratio_mean"].item() == pytest.approx(1.0)
    assert loss.item() == pytest.approx(-adv.mean().item(), abs=1e-6)
    loss.backward()
    # d(-mean(r*A))/d logp = -A / (2 * m_i) on each valid token
    want = torch.tensor([[-1.5 / 6] * 3, [0.8 / 4, 0.8 / 4, 0.0]])
    assert torch.allclose(logp.grad, want, atol=1e-6)


def test_clipping_stops_the_gradient_beyond_the_trust_region() -> None:
    mask = torch.ones(2, 2)
    old = torch.zeros(2, 2)
    logp = torch.tensor([[0.5, 0.5], [-0.5, -0.5]], requires_grad=True)  # ratios e^0.5 and e^-0.5
    adv = torch.tensor([1.0, 1.0])
    loss, stats = gagpo_policy_loss(logp, old, None, adv, mask, clip_eps=0.2, kl_coeff=0.0)
    loss.backward()
    assert torch.all(logp.grad[0] == 0)  # ratio 1.65 > 1.2 with A > 0: clipped, no gradient
    assert torch.all(logp.grad[1] < 0)  # ratio 0.61 < 0.8 with A > 0: the unclipped term is the minimum
    assert stats["clip_fraction"].item() == 1.0
    assert stats["policy_loss"].item() == pytest.approx(-(1.2 + math.exp(-0.5)) / 2, abs=1e-6)


def test_kl_is_zero_at_the_reference_and_positive_elsewhere() -> None:
    logp, old, _, adv, mask = _inputs()
    _, stats = gagpo_policy_loss(logp, old, logp.detach().clone(), adv, mask)
    assert stats["kl"].item() == 0.0
    _, stats = gagpo_policy_loss(logp, old, logp.detach() - 0.3, adv, mask)
    assert stats["kl"].item() > 0


def test_padding_and_empty_steps_are_ignored() -> None:
    logp, old, ref, adv, mask = _inputs()
    base, _ = gagpo_policy_loss(logp, old, ref, adv, mask)
    noisy = logp.detach().clone()
    noisy[1, 2] = 5.0  # a padded position
    loss, _ = gagpo_policy_loss(noisy, old, ref, adv, mask)
    assert loss.item() == pytest.approx(base.item(), abs=1e-6)
    pad_row = torch.zeros(1, 3)
    loss3, _ = gagpo_policy_loss(
        torch.cat([logp.detach(), pad_row]),
        torch.cat([old, pad_row]),
        torch.cat([ref, pad_row]),
        torch.cat([adv, torch.tensor([100.0])]),
        torch.cat([mask, pad_row]),
    )
    assert loss3.item() == pytest.approx(base.item(), abs=1e-6)


def test_entropy_bonus_lowers_the_loss() -> None:
    logp, old, ref, adv, mask = _inputs()
    ent = torch.full_like(logp, 2.0)
    a, _ = gagpo_policy_loss(logp, old, ref, adv, mask)
    b, stats = gagpo_policy_loss(logp, old, ref, adv, mask, entropy=ent, entropy_coeff=0.01)
    assert stats["entropy"].item() == pytest.approx(2.0)
    assert b.item() == pytest.approx(a.item() - 0.02, abs=1e-6)


def test_bad_shapes_name_the_argument() -> None:
    logp, old, ref, adv, mask = _inputs()
    with pytest.raises(ValueError, match="advantages"):
        gagpo_policy_loss(logp, old, ref, adv[:1], mask)
    with pytest.raises(ValueError, match="old_logp"):
        gagpo_policy_loss(logp, old[:, :2], ref, adv, mask)
    with pytest.raises(ValueError, match="ref_logp"):
        gagpo_policy_loss(logp, old, None, adv, mask, kl_coeff=0.1)


def test_behaviour_weights_are_the_truncated_length_normalised_ratio() -> None:
    proximal = [[-1.0, -2.0], [-0.5], [-0.1, -0.1, -0.1], [float("nan")], []]
    behaviour = [[-1.2, -2.4], [-3.0], [-0.1, -0.1, -0.1], [-1.0], []]
    weights, unusable = behaviour_weights(proximal, behaviour, cap=5.0)
    assert weights[0] == pytest.approx(math.exp((0.2 + 0.4) / 2))
    assert weights[1] == 5.0  # exp(2.5) truncated at the cap
    assert weights[2] == 1.0 and weights[4] == 1.0  # on-policy, and a step without tokens
    assert weights[3] == 1.0 and unusable == 1  # a NaN behaviour log-prob: counted, treated as on-policy
    with pytest.raises(ValueError, match="behaviour"):
        behaviour_weights([[-1.0]], [[-1.0, -2.0]], cap=5.0)


def test_behaviour_weights_scale_each_steps_clipped_surrogate() -> None:
    logp, old, ref, adv, mask = _inputs()
    plain, _ = gagpo_policy_loss(logp, old, None, adv, mask, kl_coeff=0.0)
    (g_plain,) = torch.autograd.grad(plain, logp)
    u = torch.tensor([2.0, 0.5])
    weighted, stats = gagpo_policy_loss(logp, old, None, adv, mask, kl_coeff=0.0, behaviour_weights=u)
    (g_weighted,) = torch.autograd.grad(weighted, logp)
    assert torch.allclose(g_weighted, g_plain * u[:, None])
    assert stats["ratio_max"] == gagpo_policy_loss(logp, old, None, adv, mask, kl_coeff=0.0)[1]["ratio_max"]
    with pytest.raises(ValueError, match="behaviour_weights"):
        gagpo_policy_loss(logp, old, None, adv, mask, kl_coeff=0.0, behaviour_weights=torch.ones(3))
