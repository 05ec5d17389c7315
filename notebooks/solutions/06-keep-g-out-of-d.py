"""Solution of lesson 6's exercise: keep G's loss out of D's .grad while D's window accumulates.

Freezing D's parameters during G's backward stops autograd from writing the leak into D's .grad,
without clearing what D's window has already accumulated.
"""

from accumlib_course.lessons import gans_two_optimizers as gan


def train_fn(G, D, g_opt, d_opt, loader):
    k = 4
    for i, (z, x) in enumerate(loader):
        fake = G(z)
        (gan.d_loss(D, fake.detach(), x) / k).backward()
        D.requires_grad_(False)  # G's loss must not reach D's .grad
        (gan.g_loss(D, fake) / k).backward()
        D.requires_grad_(True)
        if (i + 1) % k == 0:
            d_opt.step()
            g_opt.step()
            d_opt.zero_grad()
            g_opt.zero_grad()
