"""Section 12, the in-place engine's cost: a training loop under ``accumlib.watch()`` (the engine behind
``accumlib run``) against the same loop alone.

A GPT-shaped model (token embedding, residual MLP blocks, a vocabulary head), micro-batches of B
sequences of T tokens, k = 4 per optimizer step, AdamW, on the CPU (or ``--device cuda``: ``python
benchmarks/run_cost.py --device cuda`` prints the section alone). Each run builds its model and optimizer
outside the timing and inside the block (the engine finds the optimizer as it is built), and both are
timed interleaved. Memory is the engine's own: the bytes of the buffers it allocated (one sum per
parameter, O), against the parameters' bytes; nothing else it holds is parameter-sized.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _render import md_table  # noqa: E402
from _timing import interleaved, pair_ratios, ratio_quartiles  # noqa: E402

NAME = "run_cost"
TITLE = "12. accumlib run / watch: the in-place engine against the loop alone, k = 4"
TIME_MAX, MEMORY_MAX = 1.2, 1.0
LIMIT = TIME_MAX
GOALS = {
    "run_cost_time": "watch() around the loop / the loop alone <= 1.2 (median), GPT-shaped model, k = 4",
    "run_cost_memory": "the engine's extra bytes <= 1x the parameters' bytes",
}
K = 4
SIZES = {  # vocabulary, width, blocks, micro-batch (sequences, tokens), optimizer steps, repeats
    "cpu": dict(vocab=1024, width=256, blocks=4, batch=(8, 64), steps=4, repeats=7),
    "cuda": dict(vocab=50304, width=768, blocks=12, batch=(8, 256), steps=4, repeats=5),
    "quick": dict(vocab=64, width=16, blocks=1, batch=(2, 8), steps=2, repeats=1),
}


class GPTShaped(torch.nn.Module):
    def __init__(self, vocab: int, width: int, blocks: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.LayerNorm(width),
                torch.nn.Linear(width, 4 * width),
                torch.nn.GELU(),
                torch.nn.Linear(4 * width, width),
            )
            for _ in range(blocks)
        )
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.emb(idx)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def run(quick: bool = False) -> dict:
    """The section on the CPU (``measure`` takes the device)."""
    return measure(quick, "cpu")


def measure(quick: bool, device: str) -> dict:
    """Median over interleaved pairs of (watch + loop) / loop, and the engine's buffer bytes."""
    size = SIZES["quick" if quick else device]
    torch.manual_seed(0)
    b, t = size["batch"]
    data = torch.randint(0, size["vocab"], (size["steps"] * K, b, t + 1), device=device)
    reports: list[Any] = []
    held: list[int] = []

    def train() -> torch.nn.Module:
        model = GPTShaped(size["vocab"], size["width"], size["blocks"]).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for s in range(size["steps"]):  # the loop under test: each micro-batch's mean over its tokens / k
            for j in range(K):
                seq = data[s * K + j]
                logits = model(seq[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, size["vocab"]), seq[:, 1:].reshape(-1)) / K
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return model

    def alone() -> Callable[[], Any]:
        return train

    def watched() -> Callable[[], Any]:
        import accumlib

        def go() -> None:
            with accumlib.watch(scan=False) as seen:
                train()
            reports.append(seen.report)
            held.append(sum(x.numel() * x.element_size() for x in seen.engine.sums.values()))

        return go

    times = interleaved({"watch": watched, "alone": alone}, size["repeats"])
    ratio = pair_ratios(times["watch"], times["alone"])
    model = GPTShaped(size["vocab"], size["width"], size["blocks"])
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    row = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "parameters": sum(p.numel() for p in model.parameters()),
        "param_bytes": param_bytes,
        "micro_batch": [b, t],
        "steps": size["steps"],
        "alone_s": statistics.median(times["alone"]),
        "watch_s": statistics.median(times["watch"]),
        "ratio": ratio,
        "ratio_quartiles": ratio_quartiles(times["watch"], times["alone"]),
        "extra_bytes": held[-1],
        "extra_over_params": held[-1] / param_bytes,
        "verdict_ok": bool(reports[-1].ok),
        "repeats": size["repeats"],
    }
    met_t, met_m = ratio <= TIME_MAX, row["extra_over_params"] <= MEMORY_MAX
    goals = {
        "run_cost_time": {
            "measured": f"{ratio:.2f}x ({row['watch_s']:.3f} s / {row['alone_s']:.3f} s)",
            "met": None if quick else met_t,
            "missed": [] if quick or met_t else [f"{ratio:.2f}x"],
        },
        "run_cost_memory": {
            "measured": f"{row['extra_over_params']:.2f}x the parameters' {param_bytes / 2**20:.1f} MiB",
            "met": None if quick else met_m,
            "missed": [] if quick or met_m else [f"{row['extra_over_params']:.2f}x"],
        },
    }
    return {
        "rows": [row],
        "goals": goals,
        "note": "median over interleaved pairs of (the loop inside accumlib.watch() / the loop alone), each "
        "building its model and AdamW outside the timing; the engine's extra bytes are the buffers it "
        "allocated (its one sum per parameter)" + ("; --quick: tiny sizes, 1 repeat" if quick else ""),
    }


def lines(res: dict, short: bool = False) -> list[str]:
    """This section's figures as markdown (``short``: the README's selection, here the same)."""
    return md_table(
        [
            "device",
            "parameters",
            "micro-batch",
            "loop alone",
            "under watch",
            "ratio [quartiles]",
            "extra memory",
            "verdict",
            f"goals <= {TIME_MAX:g}x, <= {MEMORY_MAX:g}x",
        ],  # fmt: skip
        [
            [
                r["device"],
                f"{r['parameters'] / 1e6:.1f}M",
                f"{r['micro_batch'][0]} x {r['micro_batch'][1]} tokens",
                f"{r['alone_s']:.3f} s",
                f"{r['watch_s']:.3f} s",
                f"{r['ratio']:.2f}x [{r['ratio_quartiles'][0]:.2f}, {r['ratio_quartiles'][1]:.2f}]",
                f"{r['extra_over_params']:.2f}x params",
                "ok" if r["verdict_ok"] else "NOT ok",
                " / ".join(
                    "met" if ok else "MISSED"
                    for ok in (r["ratio"] <= TIME_MAX, r["extra_over_params"] <= MEMORY_MAX)
                ),
            ]
            for r in res["rows"]
        ],
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    result = measure(a.quick, a.device)
    print("\n".join(lines(result)))
    print(result["goals"])
