"""Run by tests/test_verify_frozen.py in a process of its own: verify on a model whose 256 MB base is frozen,
printing verify's extra peak resident memory in MB (ru_maxrss growth)."""

import resource

import torch
import torch.nn.functional as F

import accumlib

K, B = 4, 4


class Net(torch.nn.Module):
    """A large frozen base (64M float32 parameters, 256 MB) under a small trainable head."""

    def __init__(self):
        super().__init__()
        self.base = torch.nn.Linear(8192, 8192, bias=False).requires_grad_(False)
        self.head = torch.nn.Linear(8192, 4)

    def forward(self, x):
        return self.head(self.base(x))


def item_losses(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def loop(model, opt, loader):
    batches = list(loader)
    for s in range(0, len(batches), K):
        window = batches[s : s + K]
        n = sum(len(y) for _, y in window)
        for batch in window:
            (item_losses(model, batch).sum() / n).backward()
        opt.step()
        opt.zero_grad()


def main() -> None:
    torch.manual_seed(0)
    model = Net()
    data = list(zip(torch.randn(32, 8192), torch.randint(0, 4, (32,))))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report = accumlib.verify(
        loop, model=model, dataset=data, item_losses=item_losses, accum_steps=K, batch_size=B
    )
    assert report.ok, str(report)
    # ru_maxrss is in KiB on Linux
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)


if __name__ == "__main__":
    main()
