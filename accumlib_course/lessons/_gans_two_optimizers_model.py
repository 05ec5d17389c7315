"""Lesson 6's GAN: a tiny generator and discriminator, their data and noise, and their item losses."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

NOISE_DIM = 4


def make_gan(seed: int = 0, hidden: int = 16) -> tuple[nn.Module, nn.Module]:
    """A tiny generator (noise -> 2-D point) and discriminator (2-D point -> logit)."""
    torch.manual_seed(seed)
    G = nn.Sequential(nn.Linear(NOISE_DIM, hidden), nn.ReLU(), nn.Linear(hidden, 2))
    D = nn.Sequential(nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))
    return G, D


def real_points(n: int, seed: int = 0) -> torch.Tensor:
    """2-D toy data: 8 small Gaussian blobs on a circle of radius 2."""
    g = torch.Generator().manual_seed(seed)
    angle = torch.randint(0, 8, (n,), generator=g).float() * (torch.pi / 4)
    centres = torch.stack([angle.cos(), angle.sin()], dim=1) * 2.0
    return centres + 0.1 * torch.randn(n, 2, generator=g)


def noise(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, NOISE_DIM, generator=torch.Generator().manual_seed(seed))


def bce(logits: torch.Tensor, label: float) -> torch.Tensor:
    """Per-item binary cross-entropy on logits (the seed's BCELoss on a sigmoid, stably)."""
    return F.binary_cross_entropy_with_logits(
        logits.squeeze(1), torch.full((len(logits),), label), reduction="none"
    )


def d_item_losses(D: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The task contract for D: items are points, labelled 1 (real) or 0 (fake)."""
    x, y = batch
    return F.binary_cross_entropy_with_logits(D(x).squeeze(1), y, reduction="none")


def g_item_losses(D: nn.Module) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """The task contract for G, given D: items are noise vectors, the target is "real"."""
    return lambda G, z: bce(D(G(z)), 1.0)


def discriminator_loss(D: nn.Module, fake: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """D's loss: the mean over all its items, fake (label 0) and real (label 1)."""
    return torch.cat([bce(D(fake), 0.0), bce(D(real), 1.0)]).mean()
