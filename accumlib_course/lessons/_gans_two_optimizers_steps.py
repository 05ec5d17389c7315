"""Lesson 6's orderings: one GAN step as the seed wrote it and its fixes (``STEPS``), and the ways to
accumulate a window with two optimizers (``ACCUMULATIONS``). The notebook prints their source.

A part of ``gans_two_optimizers.py``, which re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._gans_two_optimizers_model import bce, discriminator_loss

# --- one GAN step, the seed's orderings ---------------------------------------------------------


def seed_as_written(G, D, g_opt, d_opt, z, x_real) -> None:
    """The seed's first listing, verbatim: D's loss reuses ``y_fake = D(G(z))`` after G has stepped.

    ``d_loss.backward()`` then runs back through G, whose weights ``g_opt.step()`` changed in
    place: PyTorch (since 1.5) refuses with "modified by an inplace operation".
    """
    x_fake = G(z)
    y_fake = D(x_fake)
    g_opt.zero_grad(set_to_none=True)
    g_loss = bce(y_fake, 1.0).mean()
    g_loss.backward(retain_graph=True)
    g_opt.step()
    y_real = D(x_real)
    d_opt.zero_grad(set_to_none=True)
    d_loss = torch.cat([bce(y_fake, 0.0), bce(y_real, 1.0)]).mean()
    d_loss.backward()  # raises: G's weights are needed here and have been changed
    d_opt.step()


def leaky(G, D, g_opt, d_opt, z, x_real) -> None:
    """The seed's "this will break" ordering (fake detached for D so it runs): D steps on the leak too."""
    x_fake = G(z)
    g_loss = bce(D(x_fake), 1.0).mean()
    g_loss.backward()  # writes G's .grad AND D's .grad (the leak)
    g_opt.step()
    g_opt.zero_grad(set_to_none=True)
    d_loss = discriminator_loss(D, x_fake.detach(), x_real)
    d_loss.backward()  # D's .grad = its own gradient + the leak
    d_opt.step()
    d_opt.zero_grad(set_to_none=True)


def zero_grad_after_g(G, D, g_opt, d_opt, z, x_real) -> None:
    """The seed's first ordering (fake detached so it runs): ``d_opt.zero_grad()`` after G's backward wipes
    the leak.
    """
    x_fake = G(z)
    g_opt.zero_grad(set_to_none=True)
    bce(D(x_fake), 1.0).mean().backward()
    g_opt.step()
    d_opt.zero_grad(set_to_none=True)  # placed here, it clears what G's backward wrote into D
    discriminator_loss(D, x_fake.detach(), x_real).backward()
    d_opt.step()


def requires_grad_toggle(G, D, g_opt, d_opt, z, x_real) -> None:
    """The article's fix: D's parameters stop requiring grad while G trains, so nothing leaks at all."""
    D.requires_grad_(False)  # autograd no longer writes D's .grad (and skips that work)
    x_fake = G(z)
    bce(D(x_fake), 1.0).mean().backward()
    g_opt.step()
    g_opt.zero_grad(set_to_none=True)
    D.requires_grad_(True)
    discriminator_loss(D, x_fake.detach(), x_real).backward()  # detach: D's loss must not reach G
    d_opt.step()
    d_opt.zero_grad(set_to_none=True)


def d_first_detach(G, D, g_opt, d_opt, z, x_real) -> None:
    """The usual DCGAN order: D on a detached fake, then G; each optimizer zeroes its own grads first."""
    x_fake = G(z)
    d_opt.zero_grad(set_to_none=True)
    discriminator_loss(D, x_fake.detach(), x_real).backward()  # detach: D's loss does not reach G
    d_opt.step()
    g_opt.zero_grad(set_to_none=True)
    bce(D(x_fake), 1.0).mean().backward()  # leaks into D, cleared by d_opt.zero_grad() next time
    g_opt.step()


STEPS: dict[str, Callable[..., None]] = {
    "the article as written": seed_as_written,
    "leaky (seed's broken order)": leaky,
    "zero_grad(D) after G's backward": zero_grad_after_g,
    "requires_grad toggle (the article's fix)": requires_grad_toggle,
    "D first, detach": d_first_detach,
}


# --- accumulation with two optimizers --------------------------------------------------------------


def accumulate_two_phase(G, D, g_opt, d_opt, z_batches, real_batches) -> None:
    """Exact: a D window on detached fakes, D steps; then a G window with D frozen, G steps."""
    n_d = sum(len(z) + len(x) for z, x in zip(z_batches, real_batches))
    for z, x in zip(z_batches, real_batches):
        fake = G(z).detach()  # D's loss must not reach G
        (torch.cat([bce(D(fake), 0.0), bce(D(x), 1.0)]).sum() / n_d).backward()
    d_opt.step()
    d_opt.zero_grad(set_to_none=True)
    n_g = sum(len(z) for z in z_batches)
    D.requires_grad_(False)  # G's loss must not reach D
    for z in z_batches:
        (bce(D(G(z)), 1.0).sum() / n_g).backward()
    D.requires_grad_(True)
    g_opt.step()
    g_opt.zero_grad(set_to_none=True)


def accumulate_interleaved_leaky(G, D, g_opt, d_opt, z_batches, real_batches) -> None:
    """Both losses per micro-batch, both steps at the end: G's backward leaks into D's window k times."""
    n_d = sum(len(z) + len(x) for z, x in zip(z_batches, real_batches))
    n_g = sum(len(z) for z in z_batches)
    for z, x in zip(z_batches, real_batches):
        fake = G(z)
        (torch.cat([bce(D(fake.detach()), 0.0), bce(D(x), 1.0)]).sum() / n_d).backward()
        (bce(D(fake), 1.0).sum() / n_g).backward()  # also adds to D's .grad
    g_opt.step()
    d_opt.step()
    g_opt.zero_grad(set_to_none=True)
    d_opt.zero_grad(set_to_none=True)


def accumulate_interleaved_zero_d(G, D, g_opt, d_opt, z_batches, real_batches) -> None:
    """As above, "fixed" with ``d_opt.zero_grad()`` after each G backward: it wipes D's window too."""
    n_d = sum(len(z) + len(x) for z, x in zip(z_batches, real_batches))
    n_g = sum(len(z) for z in z_batches)
    for z, x in zip(z_batches, real_batches):
        fake = G(z)
        (bce(D(fake), 1.0).sum() / n_g).backward()
        d_opt.zero_grad(set_to_none=True)  # clears the leak, and every earlier micro-batch of D's window
        (torch.cat([bce(D(fake.detach()), 0.0), bce(D(x), 1.0)]).sum() / n_d).backward()
    g_opt.step()
    d_opt.step()
    g_opt.zero_grad(set_to_none=True)
    d_opt.zero_grad(set_to_none=True)


ACCUMULATIONS: dict[str, Callable[..., None]] = {
    "two phases (D window, then G window)": accumulate_two_phase,
    "interleaved, leaky": accumulate_interleaved_leaky,
    "interleaved, zero_grad(D) per micro-batch": accumulate_interleaved_zero_d,
}
