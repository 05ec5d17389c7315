"""The runs behind benchmarks/verify_scale.py: the MLP of the issue, the two loops as a user writes them,
and one measurement (the loop alone, or verify) in a fresh process, so each peak is that process's own.

    # what measure() runs
    python benchmarks/_verify_scale_runs.py --child '{"specs": [...], "guard_bytes": N}'
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, also when run as --child
from _peak import Peak  # noqa: E402

K = 8  # the accumulation
THREADS = 1  # the issue measured on one CPU thread


@dataclass(frozen=True)
class Scale:
    """The MLP ``in_features -> widths... -> classes`` and the run: micro-batch size and optimizer steps.
    With ``seq`` > 0, a GPT of nanoGPT's layout (``accumlib.models.GPT``) instead: ``layers`` blocks of
    ``heads`` heads, ``in_features`` wide, a vocabulary of ``classes``, over sequences of ``seq`` tokens."""

    in_features: int
    widths: tuple[int, ...]
    classes: int
    batch_size: int
    steps: int
    layers: int = 0
    heads: int = 0
    seq: int = 0

    @property
    def n_items(self) -> int:
        # a whole number of full windows: every loop below steps on each (rows: items or sequences)
        return self.steps * K * self.batch_size

    @property
    def model(self) -> str:
        return "GPT" if self.seq else "MLP"


FULL = Scale(1024, (4096, 4096, 4096), 400, 16, 4)  # 39,399,824 parameters: the 39.4M (150.3 MiB)
QUICK = Scale(32, (64, 64), 10, 4, 2)
# nanoGPT's shakespeare-char model (6 layers, 6 heads, 384 wide, 65 characters; 10.7M parameters), on
# sequences of 64 of its 256 positions so that one thread runs it in seconds
GPT_FULL = Scale(384, (), 65, 4, 4, layers=6, heads=6, seq=64)
GPT_QUICK = Scale(16, (), 11, 2, 2, layers=1, heads=2, seq=8)


def build(scale: Scale, seed: int = 0) -> tuple[torch.nn.Module, torch.utils.data.TensorDataset]:
    """The model and a synthetic set (classes, or next tokens), both from ``seed`` (no download)."""
    torch.manual_seed(seed)
    if getattr(scale, "seq", 0):  # verify_ranks' own Scale (``_ranks_worker.py``) is an MLP's alone
        from accumlib.models import GPT

        gpt = GPT(scale.classes, scale.layers, scale.in_features, scale.heads, max_len=scale.seq)
        g = torch.Generator().manual_seed(seed + 1)
        tokens = torch.randint(scale.classes, (scale.n_items, scale.seq + 1), generator=g)
        return gpt, torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    sizes = (scale.in_features, *scale.widths)
    layers: list[torch.nn.Module] = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(sizes[-1], scale.classes))
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(scale.n_items, scale.in_features, generator=g)
    y = torch.randint(scale.classes, (scale.n_items,), generator=g)
    return model, torch.utils.data.TensorDataset(x, y)


def item_losses(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    x, y = (
        batch  # an MLP's (rows, classes) logits, or a GPT's (rows, tokens, vocabulary): one loss per target
    )
    return F.cross_entropy(model(x).flatten(0, -2), y.flatten(), reduction="none")


# --- the two loops of the issue, as a user writes them ----------------------------------------------


def correct(model, optimizer, loader):
    """grad of (1/N) sum_i l_i  ==  sum over the window's micro-batches of grad(sum_{i in mb} l_i / N)."""
    for i, (x, y) in enumerate(loader):
        n = K * y.numel()  # N: the dataset is a whole number of full windows of equal micro-batches
        (F.cross_entropy(model(x).flatten(0, -2), y.flatten(), reduction="sum") / n).backward()
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def never_divided(model, optimizer, loader):
    """Each micro-batch's mean loss goes to backward as it is, so every step sees about K x the true
    gradient."""
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x).flatten(0, -2), y.flatten()).backward()
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


# loop -> (train_fn, the finding codes verify must report: none for a correct loop)
LOOPS = {"correct": (correct, frozenset()), "never-divided": (never_divided, frozenset({"unscaled-sum"}))}


# --- one run, in a fresh process -----------------------------------------------------------------------


def prepare(mode: str, fn: Any, model: torch.nn.Module, dataset: Any, batch_size: int) -> Any:
    """The run to measure, as a zero-argument call; what the loop alone needs is built here, outside it."""
    import accumlib

    if mode in ("verify", "recompute"):  # verify as it runs by default (in place), and its recompute oracle
        oracle = "auto" if mode == "verify" else "recompute"
        return lambda: accumlib.verify(
            fn,
            model=model,
            dataset=dataset,
            item_losses=item_losses,
            accum_steps=K,
            batch_size=batch_size,
            oracle=oracle,
        )
    net = copy.deepcopy(model)  # made before the run: verify's own copies are part of what verify adds
    opt = torch.optim.SGD(net.parameters(), lr=0.05)  # verify's default optimizer
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False)
    return lambda: fn(net, opt, loader)


def measure_here(spec: dict) -> dict:
    """Measure ``spec['mode']`` ('alone', 'verify' or 'recompute') of one loop in this process: peak above
    the baseline, wall time per run; or, for 'pairs', the loop alone and verify in turn (``pairs``)."""
    import accumlib
    import accumlib_course.memory

    scale = Scale(**{**spec["scale"], "widths": tuple(spec["scale"]["widths"])})
    fn, _ = LOOPS[spec["loop"]]
    tiny, tiny_data = build(QUICK)
    # one-time imports (torch.optim loads torch._dynamo), before the baseline
    for mode in ("alone", "verify") if spec["mode"] == "pairs" else (spec["mode"],):
        prepare(mode, fn, tiny, tiny_data, QUICK.batch_size)()
    model, dataset = build(scale)
    if spec["mode"] == "pairs":
        return pairs(spec, fn, model, dataset, scale.batch_size)
    out: dict[str, Any] = {"runs": [], "accumlib": str(Path(accumlib.__file__).parent)}
    spent = time.perf_counter()
    while len(out["runs"]) < spec["repeats"] and (
        not out["runs"] or time.perf_counter() - spent < spec["budget_s"]
    ):
        run = prepare(spec["mode"], fn, model, dataset, scale.batch_size)
        with Peak() as peak:
            t0 = time.perf_counter()
            result = run()
            wall = time.perf_counter() - t0
        out["runs"].append(
            {
                "wall_s": wall,
                "extra_peak_bytes": peak.extra,
                "base_bytes": peak.base,
                "exact_peak": peak.exact,
            }
        )
        if spec["mode"] != "alone":
            out |= {
                "ok": bool(result.ok),
                "codes": sorted(getattr(result, "codes", [])),
                "steps": len(getattr(result, "steps", [])),
                "oracle": result.oracle,
            }
        del result, run  # the next run's baseline holds the model and data only
    if spec["mode"] == "alone":
        x, y = dataset[: scale.batch_size]
        out["param_count"] = sum(p.numel() for p in model.parameters())
        out["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
        out["activation_bytes"] = accumlib_course.memory.activation_bytes(model, (x, y), item_losses)
    return out


def pairs(spec: dict, fn: Any, model: torch.nn.Module, dataset: Any, batch_size: int) -> dict:
    """The loop alone and verify, one after the other, ``spec['repeats']`` times (the order flipped each
    round), in this one process: the time ratio of each pair is measured under the same conditions. Two
    fresh processes doing the same work differ here by up to 40% (the same loop alone: 4.9 s in one, 7.0 s
    in another, each steady over its runs), which a ratio of two processes' times would read as verify's."""
    times: dict[str, list[float]] = {"alone": [], "verify": []}
    for r in range(spec["repeats"]):
        for mode in ("alone", "verify") if r % 2 == 0 else ("verify", "alone"):
            run = prepare(mode, fn, model, dataset, batch_size)
            t0 = time.perf_counter()
            run()
            times[mode].append(time.perf_counter() - t0)
            del run
    return {"pairs": times}


def child(specs: list[dict], guard_bytes: int) -> list[dict]:
    """The ``--child`` process: the guard first, so that everything it allocates is under it."""
    resource.setrlimit(resource.RLIMIT_AS, (guard_bytes, guard_bytes))
    torch.set_num_threads(THREADS)
    return [measure_here(spec) for spec in specs]


# glibc with a fixed mmap threshold: every freed block of 64 KiB or more goes back to the kernel at once. With
# its defaults glibc raises the threshold as large blocks are freed and serves the blocks that follow from a
# heap it keeps, so a peak of resident memory also counts what the allocator kept (docs/performance.md)
FIXED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def measure(specs: list[dict], guard_bytes: int, timeout_s: float) -> list[dict]:
    """``specs`` in one fresh process: their figures, or each {'error': why}. A spec with
    ``"malloc": "fixed"`` (the first one decides) runs under ``FIXED_MALLOC``."""
    env = {**os.environ, **FIXED_MALLOC} if specs and specs[0].get("malloc") == "fixed" else None
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        json.dumps({"specs": specs, "guard_bytes": guard_bytes}),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return [{"error": f"ran past {timeout_s:.0f} s"}] * len(specs)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode == 0 and last.startswith("["):
        return json.loads(last)
    err = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    memory = [
        line
        for line in proc.stderr.splitlines()
        if re.search(r"MemoryError|can't allocate memory|bad_alloc", line)
    ]
    if memory:  # anywhere in the traceback: verify re-raises the loop's error as its own
        size = re.search(r"allocate (\d+) bytes", memory[-1])
        why = f"an allocation of {_gb(int(size.group(1)))} was refused" if size else memory[-1].strip()[:120]
        return [{"error": f"over the {guard_bytes / 2**30:.1f} GiB guard: {why}", "over_guard": True}] * len(
            specs
        )
    return [{"error": err[-240:]}] * len(specs)


def _gb(n: float) -> str:
    # the unit; MB for the tiny --quick MLP
    return f"{n / 1e9:.2f} GB" if abs(n) >= 1e8 else f"{n / 1e6:.1f} MB"


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="one verify_scale measurement process (see measure())")
    p.add_argument("--child", required=True, help="JSON: the specs and the guard in bytes")
    job = json.loads(p.parse_args().child)
    print(json.dumps(child(job["specs"], job["guard_bytes"])))
