"""The GPU check (`make gpu-check`): accumlib's CUDA paths, run once, by one short script (issue 29).

On the device machine (a copy of the working tree, the image's own PyTorch, no package index):

    PYTHONPATH=. python tools/gpu_check.py --out $OUT/gpu    # or: make gpu-check PY=python GPU_OUT=$OUT/gpu

Four parts, each judged; cost on one H100 estimated (no session has run this on a GPU yet), under 5 min:

  a  the reference table: `accumlib selfcheck --device cuda --json --task T` for every task, every verdict
     a loop's contract promises must hold (~30 s: 20 rows of tiny models, launch-bound); a row that
     fails is re-run with TF32 off, to tell TF32 rounding from a broken path
  b  every lesson computation that takes `device` (lessons 1-5 and 10) with device="cuda" and the
     notebook's own arguments, judged by the claims the notebook asserts on its result (~90 s)
  c  mixed precision under `accumlib.verify`: the gallery's GradScaler loops on CUDA, float16 and
     bfloat16 autocast: unscale_ then clip is ok, clip before unscale_ is named
     `clip-before-unscale` (~10 s)
  d  verify at real size: a GPT-2-small-shaped model (124.4M parameters, plain torch, no download),
     k = 8, a correct and a never-divided loop: the verdicts, verify's time and peak CUDA memory
     (torch.cuda.max_memory_allocated) beside the loop alone's, against benchmarks/verify_scale.py's
     goals (~40 s; the goals are figures, met or MISSED, not checks)

`--dry-run` runs the same parts on the CPU at the smallest sizes (one task in a, smaller lesson
arguments, a 2-layer model in d, no memory figures) so that CI runs the script end to end.
A check that needs a package this Python lacks (numpy or matplotlib for the lessons, tqdm) is skipped
by name. Every figure goes to OUT/gpu_check.json, a table to
OUT/gpu_check.md. Exit status: 0 every check held; 1 a check failed or raised; 2 bad usage;
3 no CUDA device (without --dry-run); 4 nothing failed, but checks were skipped (missing packages).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib
import importlib.util
import io
import json
import math
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the copied tree, with or without PYTHONPATH=.
import accumlib  # noqa: E402
from accumlib.tasks import classification_losses, token_losses  # noqa: E402
from accumlib.tolerances import BF16_RTOL, FLOAT32_RTOL  # noqa: E402
from accumlib_course.memory import activation_bytes, cuda_peak_bytes  # noqa: E402

NO_CUDA, SKIPPED = 3, 4
OPTIONAL = ("numpy", "sklearn", "matplotlib", "tqdm", "ipywidgets")  # what a check may need beyond torch
# the gallery's window and clip (accumlib_course/gallery/_common.py), restated: the gallery imports tqdm
GALLERY_K, GALLERY_CLIP = 4, 0.1


def constants(path: str, *names: str) -> list[Any]:
    """Module constants read from ``path``'s source (the benchmarks' modules import matplotlib)."""
    tree = ast.parse((ROOT / path).read_text())
    found = {
        t.id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and t.id in names
    }
    return [found[name] for name in names]


# the verify-at-scale goals: k, verify's extra peak in parameter bytes, verify's time / the loop alone's
[K] = constants("benchmarks/_verify_scale_runs.py", "K")
MEMORY_MAX_PARAMS, TIME_MAX = constants("benchmarks/verify_scale.py", "MEMORY_MAX_PARAMS", "TIME_MAX")


def check(name: str, holds: bool | None, figures: dict | None = None, why: str = "") -> dict:
    """One judged line of the report: held, FAILED, or skipped (``holds=None``; ``why`` says why)."""
    status = "skipped" if holds is None else "held" if holds else "FAILED"
    return {"name": name, "status": status, "figures": figures or {}, "why": why}


def attempt(name: str, run: Callable[[], list[dict]]) -> list[dict]:
    """``run()``'s checks; a missing package skips it by name, any other error is one failed check."""
    try:
        return run()
    except ModuleNotFoundError as err:
        return [check(name, None, why=f"needs the package {err.name!r}, which this Python lacks")]
    except Exception as err:  # noqa: BLE001  (CUDA out of memory included): the other checks still run
        tail = "".join(traceback.format_exception(err)[-3:]).strip()
        return [check(name, False, why=f"raised {type(err).__name__}: {err}\n{tail}")]


# --- a: the reference table ---------------------------------------------------------------------------


@contextlib.contextmanager
def tf32(on: bool):
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def table_of(task: str, dev: torch.device) -> list[dict]:
    from accumlib.cli import main as cli
    from accumlib.reference import check_reference_loops

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cli(["selfcheck", "--device", dev.type, "--json", "--task", task])
    checks = [check(f"accumlib selfcheck --task {task}: exit status 0", status == 0, {"exit": status})]
    for row in json.loads(out.getvalue())["rows"]:
        fig = {k: row[k] for k in ("max_rel_error", "min_cosine", "steps", "verdict", "expected")}
        if not row["holds"] and dev.type == "cuda":  # TF32 rounding, or a broken path?
            with tf32(False):
                again = check_reference_loops(tasks=[task], loops=[row["loop"]], device=dev).rows[0]
            fig |= {"verdict_tf32_off": again.verdict, "max_rel_error_tf32_off": again.max_rel_error}
        checks.append(check(f"{row['loop']} on {task}", row["holds"], fig))
    return checks


def part_a(dev: torch.device, dry: bool) -> list[dict]:
    tasks = ["mlp-digits"] if dry else list(accumlib.TASKS)
    return [c for t in tasks for c in attempt(f"accumlib selfcheck --task {t}", lambda t=t: table_of(t, dev))]


# --- b: every lesson's computations on the device -------------------------------------------------------


def le(x: float, limit: float) -> tuple[float, bool]:
    return x, x <= limit


def gt(x: float, limit: float) -> tuple[float, bool]:
    return x, x > limit


def near(x: float, target: float, rtol: float) -> tuple[float, bool]:
    return x, abs(x - target) < rtol * abs(target)


def _normalizing(r: Any, m: Any, dev: torch.device) -> dict:
    naive, div = r.norm_ratio["naive (accumlib.naive)"], r.rel_error["loss / k (accumlib.normalized)"]
    return {
        "naive: |g| / |g*| == k (worst |ratio / k - 1|)": le(
            max(abs(x / k - 1) for x, k in zip(naive, r.ks)), 1e-3
        ),
        "loss / k: exact": le(max(div), FLOAT32_RTOL),
        "grad / k after the window: exact": le(max(r.rel_error["grad / k after the window"]), FLOAT32_RTOL),
        "BERT post reports 1/k (worst |k ratio - 1|)": le(
            max(abs(x * k - 1) for x, k in zip(r.reported_ratio, r.ks)), 1e-3
        ),
    }


def _ragged(r: Any, m: Any, dev: torch.device) -> dict:
    drop, by_k, by_batches, exact = (r.strategies[name] for name in m.STRATEGIES)
    return {
        "dropping the tail: exact on what it steps": le(drop.worst, FLOAT32_RTOL),
        "loss / k: the tail step is off": gt(by_k.rel_error[-1], 0.1),
        "loss / window's batches: the tail step is off": gt(by_batches.rel_error[-1], 0.01),
        "weighing every item: exact": le(exact.worst, FLOAT32_RTOL),
        "weighing every item: every item stepped": (exact.items_stepped, exact.items_stepped == r.n),
    }


def _project(r: Any, m: Any, dev: torch.device) -> dict:
    judge = {"ragged": lambda g: le(g, FLOAT32_RTOL), "normalized": lambda g: gt(g, 10 * FLOAT32_RTOL)}
    return {
        f"{c.loop} {c.batch_size} x {c.accum_steps}: gap to the 32 x 1 curve": judge.get(
            c.loop, lambda g: gt(g, 0.1)
        )(r.gap(c))
        for c in r.curves
    }


def _train(r: Any, m: Any, dev: torch.device) -> dict:
    batch, accum, naive, doubled = r.runs
    return {
        "accumulated == batch (largest loss gap)": le(r.max_curve_gap(batch, accum), 1e-4),
        "naive != batch": gt(r.max_curve_gap(batch, naive), 0.1),
        "naive == batch at lr x k": le(r.max_curve_gap(naive, doubled), 1e-4),
    }


def _sweep(r: Any, m: Any, dev: torch.device) -> dict:
    _, accum, naive = r.accuracy
    differ = sum(a != b for a, b in zip(r.accuracy[naive][:-1], r.accuracy[accum][1:]))
    return {"naive at lr == accumulated at k lr (accuracies that differ)": le(differ, 0)}


def _norms(r: Any, m: Any, dev: torch.device) -> dict:
    b, g = r.errors["batch"], r.errors["group"]
    return {
        "GroupNorm: exact at every k": le(max(g), FLOAT32_RTOL),
        "BatchNorm: off at every k > 1": gt(min(b[1:]), 100 * FLOAT32_RTOL),
        "BatchNorm: the error grows with k": (b, b == sorted(b)),
    }


def _windows(r: Any, m: Any, dev: torch.device) -> dict:
    ok, clip_first, mid = r.rel_error.values()
    return {
        "unscale_ then clip: close": le(ok, BF16_RTOL),
        "clip before unscale_: off": gt(clip_first, 0.9),
        "scale change mid-window: off": gt(mid, 0.2),
    }


# "module.function": (the notebook's arguments, --dry-run's changes, claims): claims(result, module, device)
# -> {claim: (its figure, whether it holds)}, the claims the notebook asserts
LESSONS: dict[str, tuple[dict, dict, Callable[..., dict]]] = {
    "why_accumulate.compute": (
        dict(accum_steps=2, batch_size=32),
        dict(max_k=4),
        lambda r, m, dev: {
            "loss / k: exact": le(r.rel_error[m.NORMALIZED], FLOAT32_RTOL),
            "naive: |g| / |g*| == k": near(r.norm_ratio[m.NAIVE], r.accum_steps, 1e-3),
            "activations: 1/k": near(r.memory_ratio, r.accum_steps, 0.01),
        },
    ),
    "why_accumulate.train": (dict(accum_steps=2, batch_size=32, lr=0.1, epochs=3), dict(epochs=1), _train),
    "why_accumulate.lr_sweep": (
        dict(accum_steps=2, batch_size=32, lrs=(0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6), epochs=3),
        dict(lrs=(0.05, 0.1, 0.2), epochs=1),
        _sweep,
    ),
    "normalizing_the_loss.compute": (dict(max_k=8, batch_size=8), dict(max_k=3), _normalizing),
    "normalizing_the_loss.optimizer_comparison": (
        dict(accum_steps=4, batch_size=16, sgd_lr=0.1, adam_lr=0.01, epochs=3),
        dict(epochs=1),
        lambda r, m, dev: {
            "SGD: naive trains otherwise": gt(r.rows()[0][1], 0.1),
            "Adam: naive trains alike": le(r.rows()[1][1], 0.01),
        },
    ),
    "normalizing_the_loss.bert_epoch": (
        dict(accum_steps=4, batch_size=8),
        {},
        lambda r, m, dev: {
            "the post reports 1/k (true / reported)": near(r.true / r.reported, r.accum_steps, 1e-3),
            "the fix reports the true loss": near(r.reported_fixed, r.true, 1e-4),
        },
    ),
    "ragged_windows_and_tokens.compute": (dict(accum_steps=4, batch_size=8, n=110), {}, _ragged),
    "ragged_windows_and_tokens.compute_tokens": (
        dict(accum_steps=4, batch_size=4),
        {},
        lambda r, m, dev: {
            "mean of means: off": gt(min(r.rel_error["loss / k (accumlib.normalized)"]), 0.01),
            "per token: exact": le(max(r.rel_error["per token (accumlib.ragged)"]), FLOAT32_RTOL),
        },
    ),
    "mixed_precision.autocast_dtype": (
        {},
        {},
        lambda r, m, dev: {
            "float16 on CUDA, bfloat16 on the CPU": (
                r,
                r == (torch.float16 if dev.type == "cuda" else torch.bfloat16),
            )
        },
    ),
    "mixed_precision.amp_vs_oracle": (
        {},
        {},
        lambda r, m, dev: {
            "float32 runs: exact": le(max(v for k, v in r.items() if "float32" in k), FLOAT32_RTOL),
            "autocast: close": le(max(r.values()), BF16_RTOL),
        },
    ),
    "mixed_precision.compute": (dict(max_norm=0.25, accum_steps=4, batch_size=8), {}, _windows),
    "mixed_precision.unscale_twice_error": (
        {},
        {},
        lambda r, m, dev: {"GradScaler refuses": (r, r != "no error")},
    ),
    "mixed_precision.inf_run": (
        dict(inf_windows=(3,), growth_interval=2),
        {},
        lambda r, m, dev: {
            "the inf window: skipped, nothing moved": (r.skipped, r.skipped == [3] and not r.params_moved[3]),
            "the inf window: scale halved": (r.scale_after[3], r.scale_after[3] == r.scale[3] / 2),
        },
    ),
    "batchnorm_vs_groupnorm.compute": (
        dict(accum_steps=(1, 2, 4, 8, 16), large_batch=32),
        dict(accum_steps=(1, 2, 4)),
        _norms,
    ),
    "batchnorm_vs_groupnorm.running_stats": (
        dict(accum_steps=8, large_batch=32),
        {},
        lambda r, m, dev: {
            "k updates per window": (
                r.batches_tracked,
                r.batches_tracked["accumulated"] == r.k * r.batches_tracked["large batch"],
            ),
            "running statistics differ": gt(min(r.rel_diff.values()), 0.1),
        },
    ),
    "batchnorm_vs_groupnorm.momentum_check": (
        dict(accum_steps=8, large_batch=32),
        {},
        lambda r, m, dev: {
            "1 - 0.9^(1/k) < 0.1/k < default / 10": (w := list(r.worst.values()), w[2] < w[1] < w[0] / 10)
        },
    ),
    "batchnorm_vs_groupnorm.training_curves": (
        dict(accum_steps=8, large_batch=32, epochs=3, n=384),
        dict(epochs=1),
        lambda r, m, dev: {
            "GroupNorm: curves coincide": le(r.max_gap("group"), 1e-4),
            "BatchNorm: curves drift": gt(r.max_gap("batch"), 1e-2),
        },
    ),
    "batchnorm_vs_groupnorm.training_budget": (
        dict(epochs=6),
        dict(epochs=3),
        lambda r, m, dev: {
            "GroupNorm behind in training loss at epoch 3": gt(
                r.train_loss["group"][2], r.train_loss["batch"][2]
            )
        },
    ),
    "your_own_project.compute": ({}, dict(settings=((8, 4),), epochs=2), _project),
}
NO_DEVICE = {  # the lessons whose computations take no device, and why (their notebooks say so)
    "gans_two_optimizers": "G and D are so small that lesson 6 runs them on the CPU either way",
    "verify_your_loop": "verify runs the gallery's loops on the CPU, where their loaders put the batches",
    "distributed": "gloo ranks on local processes",
    "real_bugs": "Hugging Face Trainers on the CPU (transformers is not in every image)",
}


def lesson(name: str, dev: torch.device, dry: bool) -> list[dict]:
    kwargs, smaller, claims = LESSONS[name]
    args = {**kwargs, **(smaller if dry else {})}
    module_name, fn = name.split(".")
    module = importlib.import_module(f"accumlib_course.lessons.{module_name}")
    start = time.perf_counter()
    result = getattr(module, fn)(**args, device=dev)
    said = claims(result, module, dev)
    figures = {"seconds": time.perf_counter() - start, "args": args} | {k: v for k, (v, _) in said.items()}
    broken = [claim for claim, (_, holds) in said.items() if not holds]
    return [check(name, not broken, figures, "; ".join(f"claim broken: {c}" for c in broken))]


def part_b(dev: torch.device, dry: bool) -> list[dict]:
    return [c for name in LESSONS for c in attempt(name, lambda n=name: lesson(n, dev, dry))]


# --- c: mixed precision under verify ----------------------------------------------------------------


def amp_loop(device_type: str, dtype: torch.dtype, unscale_first: bool) -> Callable[..., None]:
    """The gallery's GradScaler loops on ``device_type``: ``correct-amp-clip-scheduler``'s order (unscale_,
    clip, step, update) or ``bug-clip-before-unscale``'s (the clip sees S x the gradient)."""

    def train(model, optimizer, loader):
        dev = next(model.parameters()).device
        scaler = torch.amp.GradScaler(device_type)
        for i, (x, y) in enumerate(loader):
            with torch.autocast(device_type, dtype=dtype):
                loss = F.cross_entropy(model(x.to(dev)), y.to(dev)) / GALLERY_K  # full windows, equal sizes
            scaler.scale(loss).backward()
            if (i + 1) % GALLERY_K == 0:
                if unscale_first:
                    scaler.unscale_(optimizer)  # once per window, so clipping sees true magnitudes
                torch.nn.utils.clip_grad_norm_(model.parameters(), GALLERY_CLIP)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)

    return train


def amp_case(dev: torch.device, dtype: torch.dtype, unscale_first: bool, name: str) -> list[dict]:
    from accumlib.data import synthetic_classification
    from accumlib.models import MLP

    torch.manual_seed(0)
    start = time.perf_counter()
    report = accumlib.verify(
        amp_loop(dev.type, dtype, unscale_first),
        model=MLP().to(dev),
        dataset=synthetic_classification(128, 64, 10),  # 4 full windows
        item_losses=classification_losses,
        accum_steps=GALLERY_K,
        batch_size=8,
    )
    code = "clip-before-unscale"
    holds = report.ok if unscale_first else not report.ok and code in report.codes
    fig = {"seconds": time.perf_counter() - start, "ok": report.ok, "codes": sorted(report.codes)}
    return [check(name, holds, fig | {"report": report.to_dict()})]


def part_c(dev: torch.device, dry: bool) -> list[dict]:
    assert "clip-before-unscale" in accumlib.CODES, "the finding code was renamed: update this check"
    cases = [(dtype, first) for dtype in (torch.float16, torch.bfloat16) for first in (True, False)]
    return [
        c
        for dtype, first in cases
        for name in [f"{'unscale_ then clip' if first else 'clip-before-unscale'}, {dtype} on {dev.type}"]
        for c in attempt(name, lambda d=dtype, f=first, n=name: amp_case(dev, d, f, n))
    ]


# --- d: verify at real size ------------------------------------------------------------------------------


class GPT(nn.Module):
    """GPT-2 small's shape in plain torch: 12 pre-norm blocks of width 768 with 12 heads, 1024 positions,
    a vocabulary of 50257 and the head tied to the token embedding: 124.4M parameters."""

    def __init__(
        self, vocab: int = 50257, width: int = 768, layers: int = 12, heads: int = 12, ctx: int = 1024
    ):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(ctx, width)
        block = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        h = self.tok(ids) + self.pos(torch.arange(t, device=ids.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=ids.device)
        return self.ln(self.blocks(h, mask=mask, is_causal=True)) @ self.tok.weight.T


def correct(model, optimizer, loader):
    """grad of (1/N) sum_i l_i == sum over the window of grad(mean_mb / K): full windows, equal sizes."""
    dev = next(model.parameters()).device
    for i, (x, y) in enumerate(loader):
        (F.cross_entropy(model(x.to(dev)).flatten(0, 1), y.to(dev).flatten()) / K).backward()
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def never_divided(model, optimizer, loader):
    dev = next(model.parameters()).device
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x.to(dev)).flatten(0, 1), y.to(dev).flatten()).backward()  # K x the gradient
        if (i + 1) % K == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def measure(fn: Callable[[], Any], dev: torch.device, repeats: int) -> tuple[Any, float, int | None]:
    """``fn()``'s result, its median wall time (CUDA synchronized) and its peak CUDA bytes above the start."""
    runs, box = [], {}

    def timed() -> None:
        start = time.perf_counter()
        box["out"] = fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)  # the kernels fn queued are part of its time
        box["s"] = time.perf_counter() - start

    for _ in range(repeats):
        box.pop("out", None)  # the previous run's result is released before this run's baseline
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            runs.append((cuda_peak_bytes(timed, device=dev), box["s"]))  # synchronizes, resets the peak
        else:
            runs.append((timed(), box["s"]))  # the CPU rehearsal times only
    seconds = sorted(s for _, s in runs)[len(runs) // 2]
    return box["out"], seconds, None if dev.type != "cuda" else max(p for p, _ in runs)


def alone(fn: Callable[..., None], model: nn.Module, data: Any, batch: int, repeats: int) -> tuple:
    """The loop by itself on a copy made before the run (verify's own copies are what verify adds)."""
    net = copy.deepcopy(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)  # verify's default optimizer
    loader = torch.utils.data.DataLoader(data, batch_size=batch)
    return measure(lambda: fn(net, opt, loader), next(net.parameters()).device, repeats)[1:]


def at_size(
    name: str, fn: Callable[..., None], codes: set[str], model: nn.Module, data: Any, size: dict
) -> dict:
    dev, batch, repeats = next(model.parameters()).device, size["micro_batch"][0], size["repeats"]

    def verify(max_steps: int | None = None) -> Callable[[], Any]:
        return lambda: accumlib.verify(
            fn,
            model=model,
            dataset=data,
            item_losses=token_losses,
            accum_steps=K,
            batch_size=batch,
            max_steps=max_steps,
        )

    measure(verify(max_steps=1), dev, 1)  # warm-up: kernels chosen, the allocator grown
    alone_s, alone_peak = alone(fn, model, data, batch, repeats)
    report, verify_s, verify_peak = measure(verify(), dev, repeats)
    fig = {
        "loop_alone_s": alone_s,
        "verify_s": verify_s,
        "time_ratio": verify_s / alone_s,
        "time_goal": TIME_MAX,
        "time_goal_met": verify_s / alone_s <= TIME_MAX,
        "loop_alone_peak_bytes": alone_peak,
        "verify_peak_bytes": verify_peak,
        "ok": report.ok,
        "codes": sorted(report.codes),
        "steps_judged": len(report.steps),
    }
    if verify_peak is not None:
        extra = verify_peak - alone_peak
        goal = MEMORY_MAX_PARAMS * size["param_bytes"] + size["activation_bytes"]
        fig |= {
            "verify_extra_peak_bytes": extra,
            "extra_over_param_bytes": extra / size["param_bytes"],
            "memory_goal_bytes": goal,
            "memory_goal_met": extra <= goal,
        }
    holds = (not report.ok and report.codes >= codes) if codes else report.ok
    return check(f"verify, {name} loop, k = {K}", holds and len(report.steps) == size["steps"], fig)


def part_d(dev: torch.device, dry: bool) -> list[dict]:
    shape = dict(vocab=64, width=32, layers=2, heads=2, ctx=16) if dry else {}
    batch, seq, steps, repeats = (2, 16, 2, 1) if dry else (4, 256, 4, 3)
    torch.manual_seed(0)
    with torch.device(dev):  # built where it runs: 124M parameters are not initialized on the CPU first
        model = GPT(**shape)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(model.tok.num_embeddings, (steps * K * batch, seq + 1), generator=g)
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    params = sum(p.numel() for p in model.parameters())
    size = {
        "parameters": params,
        "param_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "micro_batch": [batch, seq],
        "k": K,
        "steps": steps,
        "repeats": repeats,
        "activation_bytes": activation_bytes(model, data[:batch], token_losses, device=dev),
    }
    checks = [check("GPT-2 small's size", dry or 124e6 < params < 125e6, size)]
    for name, fn, codes in (("correct", correct, set()), ("never-divided", never_divided, {"unscaled-sum"})):
        run = lambda n=name, f=fn, c=codes: [at_size(n, f, c, model, data, size)]  # noqa: E731
        checks += attempt(f"verify, {name} loop", run)
    return checks


# --- the run ------------------------------------------------------------------------------------------------

PARTS = {
    "a": ("reference table", part_a),
    "b": ("lessons", part_b),
    "c": ("mixed precision", part_c),
    "d": ("verify at size", part_d),
}


def has(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a broken install is as good as none
        return False


def environment(dev: torch.device) -> dict:
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "packages": {p: has(p) for p in OPTIONAL},
    }
    if dev.type == "cuda":
        env["tf32"] = {
            "matmul": torch.backends.cuda.matmul.allow_tf32,
            "cudnn": torch.backends.cudnn.allow_tf32,
        }
    return env


def markdown(result: dict) -> str:
    lines = [
        f"# GPU check, {result['mode']}: {result['verdict']} in {result['seconds']:.0f} s",
        "",
        f"`{json.dumps(result['environment'])}`",
        "",
        "| part | held | failed | skipped | seconds |",
        "|---|---|---|---|---|",
    ]
    for key, part in result["parts"].items():
        n = [sum(c["status"] == s for c in part["checks"]) for s in ("held", "FAILED", "skipped")]
        lines.append(f"| {key}. {part['title']} | {n[0]} | {n[1]} | {n[2]} | {part['seconds']:.1f} |")
    lines += ["", "| check | status | figures or why |", "|---|---|---|"]
    for key, part in result["parts"].items():
        for c in part["checks"]:
            if c["status"] != "held" or key == "d":
                said = c["why"].splitlines()[0] if c["why"] else json.dumps(plain(c["figures"]))
                lines.append(f"| {key}. {c['name']} | {c['status']} | {said.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def plain(x: Any) -> Any:
    """JSON without NaN or inf (written as strings), tuples as lists, dtypes and devices as text."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set)):
        return [plain(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x if isinstance(x, (str, int, float, bool, type(None))) else str(x)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Exit status: 0 held, 1 failed, 2 usage, 3 no CUDA device, 4 skipped (missing packages).",
    )
    p.add_argument("--out", default="reports/gpu-check", help="folder for gpu_check.json and gpu_check.md")
    p.add_argument("--dry-run", action="store_true", help="the same parts on the CPU at the smallest sizes")
    p.add_argument("--parts", default="abcd", help="the parts to run, as letters (default: abcd)")
    args = p.parse_args(argv)
    if not args.parts or set(args.parts) - set(PARTS):
        p.error(f"--parts must be letters of 'abcd' (got {args.parts!r})")
    if not args.dry_run and not torch.cuda.is_available():
        print(
            f"gpu_check: no CUDA device here (torch {torch.__version__}, CUDA {torch.version.cuda}): run it "
            "on a machine with a GPU, or with --dry-run for the CPU rehearsal",
            file=sys.stderr,
        )
        return NO_CUDA
    dev = torch.device("cpu" if args.dry_run else "cuda")
    if args.dry_run:
        torch.set_num_threads(1)  # tiny models: one thread is as fast, and spares a shared CI machine
    result = {
        "mode": "dry run on the CPU" if args.dry_run else "CUDA",
        "environment": environment(dev),
        "lessons_without_device": NO_DEVICE,
        "parts": {},
    }
    started = time.perf_counter()
    for key in dict.fromkeys(args.parts):
        title, run = PARTS[key]
        print(f"gpu_check: part {key}, {title} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        checks = attempt(title, lambda run=run: run(dev, args.dry_run))
        result["parts"][key] = {"title": title, "seconds": time.perf_counter() - start, "checks": checks}
    statuses = {c["status"] for part in result["parts"].values() for c in part["checks"]}
    code = 1 if "FAILED" in statuses else SKIPPED if "skipped" in statuses else 0
    verdict = {0: "every check held", 1: "FAILED", SKIPPED: "nothing failed, checks skipped"}[code]
    result |= {"seconds": time.perf_counter() - started, "exit_status": code, "verdict": verdict}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(plain(result), indent=1))
    (out / "gpu_check.md").write_text(markdown(result))
    print(markdown(result))
    print(f"gpu_check: {verdict} in {result['seconds']:.0f} s; wrote {out}/gpu_check.json and gpu_check.md")
    return code


if __name__ == "__main__":
    sys.exit(main())
