"""Section 10, verify across ranks: ``accumlib.verify(..., ranks="all")`` on 2 gloo ranks (CPU) against the
same correct DDP loop alone (``accumlib.examples.ddp_loops.LOOPS["correct"]``), same data, same ranks.

Two models: an MLP of 11.3M float32 parameters (45.2 MB; built like verify_scale's) and the lm-tokens
task's tiny causal LM (16.8K parameters: time and traffic only, its memory is below the noise). Three
figures, each per rank:

    time      median over 3 interleaved pairs of verify / loop alone, on rank 0 (both ranks start
              each run at a barrier; their collectives keep them in step), after a warm-up of each
    memory    verify's extra peak resident memory over the loop alone's, per rank: two fresh launches
              (one runs the loop alone first, one verify first), each run's peak (VmHWM, reset at its
              start: _peak.Peak, inside each rank) above the same kind of baseline (model and data
              built, a warm-up of both on a tiny MLP done so one-time imports are outside)
    traffic   counted, not computed: torch.distributed's Python collectives (all_reduce, broadcast,
              all_gather_object, all_gather, ...) are wrapped in each rank during verify's measured run and
              every call is attributed to verify (a caller in accumlib/_verify) or to the loop (its
              4-byte item-count all-reduce); the loop's DDP gradient all-reduce goes through DDP's C++
              reducer, which such a wrap never sees, so a DDP communication hook counts it apart

Goals (the single-process ones of verify_scale, plus what the exchange itself may add):

    time      verify / loop alone <= 3.0 (median), as verify_scale_time for one process
    memory    extra per rank <= 5 x parameter bytes + one micro-batch's activations: one process's
              budget (4x + activations) plus the exchange's one P-sized float32 buffer
    traffic   verify's collectives per optimizer step and rank <= 4 x parameter bytes + 64 KiB
              (ranks.py: at most 4 P-sized collectives per step, plus a few gathered numbers)

    python benchmarks/verify_ranks.py            # the full section (about a minute on 2 cores)
    python benchmarks/verify_ranks.py --quick    # tiny sizes, one launch: keeps the script working
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, also in the spawned ranks
from _render import md_table  # noqa: E402

NAME = "verify_ranks"
TITLE = "10. Verify across ranks: verify(ranks='all') on 2 gloo ranks, a correct DDP loop"
WORLD = 2
TIME_MAX = 3.0
MEMORY_MAX_PARAMS = 5.0  # one process's 4x + the exchange's one P-sized buffer
TRAFFIC_MAX_PARAMS = 4.0  # P-sized collectives per step (ranks.py's docstring)
TRAFFIC_SLACK = 64 * 1024  # the gathered numbers beside them
LIMIT = TIME_MAX
GOALS = {
    "verify_ranks_time": "verify(ranks='all') / the same DDP loop alone <= 3.0 on 2 gloo ranks (median), "
                         "11.3M-parameter MLP and lm-tokens",
    "verify_ranks_memory": "verify(ranks='all')'s extra peak memory per rank over the loop alone <= 5x parameter bytes "
                           "+ one micro-batch's activations (one process's 4x, plus one P-sized exchange buffer), 11.3M-parameter MLP",
    "verify_ranks_traffic": "verify(ranks='all')'s collectives per optimizer step and rank <= 4x parameter bytes + 64 KiB (counted)",
}
LAUNCH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Scale:
    """The MLP ``in_features -> widths... -> classes``, micro-batch size, k, and optimizer steps per rank."""

    in_features: int
    widths: tuple[int, ...]
    classes: int
    batch_size: int
    k: int
    steps: int

    @property
    def n_items(self) -> int:
        return WORLD * self.steps * self.k * self.batch_size  # whole windows on every rank: equal counts


FULL = Scale(1024, (2048, 2048, 2048), 400, 16, 4, 2)  # 11,311,504 parameters (45.2 MB)
QUICK = Scale(32, (64, 64), 10, 4, 2, 2)
WARM = Scale(16, (32,), 4, 2, 2, 1)  # the warm-up before any baseline


def build(scale: Scale, seed: int = 0) -> tuple[torch.nn.Module, torch.utils.data.TensorDataset]:
    """The MLP and a synthetic classification set, both from ``seed`` (as verify_scale.build)."""
    torch.manual_seed(seed)
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
    x, y = batch
    return F.cross_entropy(model(x), y, reduction="none")


def count_items(batch: Any) -> int:
    return len(batch[1])


class Case:
    """One model and its data, as ddp_loops' tasks are: what ``LOOPS["correct"](task)`` and verify need."""

    def __init__(self, name: str, scale: Scale | None):
        import accumlib

        self.name = name
        if scale is None:  # the lm-tokens task
            t = accumlib.get_task("lm-tokens")
            self.model, self.dataset = t.make_model(0), t.make_dataset()
            self.task = t
            self.batch_size, self.k, self.collate_fn = t.batch_size, t.accum_steps, t.collate_fn
        else:
            self.model, self.dataset = build(scale)
            self.task = SimpleNamespace(item_losses=item_losses, count_items=count_items, accum_steps=scale.k)
            self.batch_size, self.k, self.collate_fn = scale.batch_size, scale.k, None

    def prepare(self, mode: str) -> Any:
        """The run to measure, as a zero-argument call; what the loop alone needs is built here, outside it."""
        import accumlib
        from accumlib.examples.ddp_loops import LOOPS

        fn = LOOPS["correct"](self.task)
        if mode == "verify":
            return lambda: accumlib.verify(fn, model=self.model, dataset=self.dataset, item_losses=self.task.item_losses,
                                           accum_steps=self.k, batch_size=self.batch_size, collate_fn=self.collate_fn,
                                           ranks="all")
        net = copy.deepcopy(self.model)  # made before the run: verify's own copies are part of what verify adds
        opt = torch.optim.SGD(net.parameters(), lr=0.05)  # verify's default optimizer
        loader = torch.utils.data.DataLoader(self.dataset, batch_size=self.batch_size, shuffle=False, collate_fn=self.collate_fn)
        return lambda: fn(net, opt, loader)


# --- counting what flows ----------------------------------------------------------------------------------

COUNTED = ("all_reduce", "broadcast", "all_gather_object", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor",
           "gather_object", "broadcast_object_list", "scatter", "reduce", "barrier")


def _nbytes(name: str, args: tuple, kwargs: dict) -> int:
    """The payload this rank hands to one call: a tensor's bytes, a picklable object's pickled size."""
    if name in ("all_gather_object", "gather_object"):
        return len(pickle.dumps(args[1] if len(args) > 1 else kwargs.get("obj")))
    if name == "broadcast_object_list":
        return len(pickle.dumps(args[0] if args else kwargs.get("object_list")))
    if name in ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "scatter"):
        t = args[1] if len(args) > 1 else None
        t = t[0] if isinstance(t, (list, tuple)) and t else t
        return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0
    t = args[0] if args else kwargs.get("tensor")
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


class Traffic:
    """Wraps torch.distributed's Python collectives while active; counts each outermost call once
    (all_gather_object runs all_gather inside) as (who, phase, op, bytes)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, int]] = []
        self._depth = 0
        self._saved: dict[str, Any] = {}
        self.ddp: list[Any] = []  # the loop's DDP gradient all-reduce, from a communication hook

    def _where(self) -> tuple[str, str, str]:
        """(who, phase, caller): who called is the first frame outside torch (accumlib/_verify: verify;
        anything else, the loop's own DDP or code included: the loop); phase, the Ranks method it runs in."""
        verify_dir = os.sep + os.path.join("accumlib", "_verify") + os.sep
        torch_dir = os.path.dirname(torch.__file__) + os.sep
        who, phase, caller = None, "-", "?"
        f = sys._getframe(2)
        while f is not None:
            path = f.f_code.co_filename
            if who is None and not path.startswith(torch_dir):
                who = "verify" if verify_dir in path else "loop"
                caller = f"{os.path.basename(path)}:{f.f_code.co_name}"
            if verify_dir in path and path.endswith("ranks.py") and f.f_code.co_name in ("step", "finish", "join"):
                phase = {"step": "step", "finish": "end", "join": "start"}[f.f_code.co_name]
                break
            f = f.f_back
        return who or "loop", phase, caller

    def __enter__(self) -> Traffic:
        import torch.distributed as dist

        from accumlib.distributed.comm import count_allreduce

        for name in COUNTED:
            if not hasattr(dist, name):
                continue
            original = self._saved[name] = getattr(dist, name)

            def wrapped(*args: Any, _name: str = name, _fn: Any = original, **kwargs: Any) -> Any:
                if self._depth == 0:
                    who, phase, caller = self._where()
                    if caller != "comm.py:_counting_allreduce":  # DDP's buckets, through the hook below: counted there
                        self.calls.append((who, phase, _name, _nbytes(_name, args, kwargs), caller))
                self._depth += 1
                try:
                    return _fn(*args, **kwargs)
                finally:
                    self._depth -= 1

            setattr(dist, name, wrapped)
        DDP = torch.nn.parallel.DistributedDataParallel
        self._init = DDP.__init__

        def init(ddp: Any, *args: Any, **kwargs: Any) -> None:
            self._init(ddp, *args, **kwargs)
            self.ddp.append(count_allreduce(ddp))  # the bucket all-reduces of the loop's own DDP, from C++

        DDP.__init__ = init
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as dist

        for name, fn in self._saved.items():
            setattr(dist, name, fn)
        torch.nn.parallel.DistributedDataParallel.__init__ = self._init

    def summary(self, steps: int) -> dict:
        def total(who: str, phase: str | None = None) -> tuple[int, int]:
            sel = [b for w, p, _, b, _ in self.calls if w == who and (phase is None or p == phase)]
            return len(sel), sum(sel)

        per_op: dict[str, list[int]] = {}
        outside: dict[str, list[int]] = {}  # the calls outside verify's steps, by caller: [calls, bytes]
        for w, p, op, b, caller in self.calls:
            if not (w == "verify" and p == "step"):
                outside.setdefault(f"{w} {op} from {caller}", [0, 0])
                outside[f"{w} {op} from {caller}"][0] += 1
                outside[f"{w} {op} from {caller}"][1] += b
            if w == "verify" and p == "step":
                per_op.setdefault(op, [0, 0])
                per_op[op][0] += 1
                per_op[op][1] += b
        step_calls, step_bytes = total("verify", "step")
        verify_calls, verify_bytes = total("verify")
        loop_calls, loop_bytes = total("loop")
        ddp_calls = sum(c.calls for c in self.ddp)
        ddp_bytes = sum(c.bytes for c in self.ddp)
        return {"steps": steps, "calls_per_step": step_calls / steps, "bytes_per_step": step_bytes / steps,
                "per_op_per_step": {op: [c / steps, b / steps] for op, (c, b) in per_op.items()},
                "verify_calls": verify_calls, "verify_bytes": verify_bytes,
                "verify_outside_steps_bytes": verify_bytes - step_bytes, "outside_steps": outside,
                "loop_python_calls_per_step": loop_calls / steps, "loop_python_bytes_per_step": loop_bytes / steps,
                "ddp_calls_per_step": ddp_calls / steps, "ddp_bytes_per_step": ddp_bytes / steps}


# --- one rank ---------------------------------------------------------------------------------------------


def rank_main(rank: int, world: int, plan_json: str, out: str) -> None:
    """What each rank of one launch does: warm up, the peak of its first run, then timings, then counted runs."""
    import torch.distributed as dist
    from _peak import Peak

    plan = json.loads(plan_json)
    torch.set_num_threads(1)
    res: dict[str, Any] = {"rank": rank}
    warm = Case("warm", WARM)
    for mode in ("alone", "verify"):  # one-time imports and allocations (DDP, gloo, verify's modules), before any baseline
        warm.prepare(mode)()
    cases = {name: Case(name, None if name == "lm-tokens" else Scale(**{**plan["scale"], "widths": tuple(plan["scale"]["widths"])}))
             for name in plan["cases"]}

    ran: set[tuple[str, str]] = set()  # (model, mode) already run in this process: warm
    traffic = res["traffic"] = {}
    if plan.get("memory"):
        mem = res["memory"] = {}
        for name, mode in plan["memory"]:
            run = cases[name].prepare(mode)
            count = mode == "verify" and name in plan.get("traffic", [])
            dist.barrier()
            with Traffic() if count else contextlib.nullcontext() as tr:  # entered outside the peak: its imports are not verify's
                with Peak() as peak:
                    report = run()
            mem[f"{name}/{mode}"] = {"extra_peak_bytes": peak.extra, "base_bytes": peak.base, "exact_peak": peak.exact}
            if mode == "verify":
                mem[f"{name}/{mode}"]["ok"] = bool(report.ok)
            if count:
                traffic[name] = tr.summary(len(report.steps)) | {"ok": bool(report.ok)}
            ran.add((name, mode))
            del run, report

    for name in plan.get("traffic", []):
        if name not in traffic:
            run = cases[name].prepare("verify")
            dist.barrier()
            with Traffic() as tr:
                report = run()
            traffic[name] = tr.summary(len(report.steps)) | {"ok": bool(report.ok)}
            ran.add((name, "verify"))

    if plan.get("time"):
        times = res["time"] = {}
        for name in plan["time"]:
            for mode in ("alone", "verify"):  # a warm-up of each not yet run here (first runs pay one-time costs)
                if (name, mode) not in ran:
                    run = cases[name].prepare(mode)
                    dist.barrier()
                    run()
            t: dict[str, list[float]] = {"alone": [], "verify": []}
            oks = []
            order = ["verify", "alone"]
            for r in range(plan["repeats"]):  # interleaved, the order flipped each round
                for mode in order if r % 2 == 0 else order[::-1]:
                    run = cases[name].prepare(mode)
                    dist.barrier()
                    t0 = time.perf_counter()
                    report = run()
                    t[mode].append(time.perf_counter() - t0)
                    if mode == "verify":
                        oks.append(bool(report.ok))
                        codes = sorted(report.codes)
                        steps = len(report.steps)
            times[name] = {**t, "ok": all(oks), "codes": codes, "steps": steps}

    res["cases"] = {name: {"param_count": sum(p.numel() for p in c.model.parameters()),
                           "param_bytes": sum(p.numel() * p.element_size() for p in c.model.parameters())}
                    for name, c in cases.items()}
    with open(os.path.join(out, f"{plan['label']}-rank{rank}.json"), "w") as fh:
        json.dump(res, fh)


def _launch(plan: dict, out: str) -> list[dict]:
    from accumlib.distributed import launch

    launch(rank_main, (json.dumps(plan), out), world_size=WORLD, timeout=LAUNCH_TIMEOUT_S)
    return [json.loads(Path(out, f"{plan['label']}-rank{r}.json").read_text()) for r in range(WORLD)]


def _activation_bytes(scale: Scale) -> int:
    import accumlib

    model, data = build(scale)
    return accumlib.memory.activation_bytes(model, data[: scale.batch_size], item_losses)


# --- the section ------------------------------------------------------------------------------------------


def run(quick: bool = False, repeats: int | None = None, verbose: bool = True) -> dict:
    """Two launches of 2 gloo ranks (one with --quick); rows per model and the three goals, as plain dicts."""
    try:
        import torch.distributed as dist

        import accumlib.distributed  # noqa: F401
    except ImportError as err:
        return {"not_available": f"accumlib.distributed cannot be imported ({err})"}
    if not dist.is_available():
        return {"not_available": "torch.distributed is not available in this build of torch"}
    scale = QUICK if quick else FULL
    mlp = f"MLP {sum(a * b + b for a, b in zip((scale.in_features, *scale.widths), (*scale.widths, scale.classes))) / 1e6:.1f}M"
    repeats = repeats or (1 if quick else 3)
    names = [mlp, "lm-tokens"]
    common = {"scale": asdict(scale), "cases": names, "repeats": repeats}
    # the loop alone's peak first in one fresh launch, verify's first in another: each peak is its process's own
    # the loop alone's peak in one fresh launch, verify's first in another (its collectives counted meanwhile),
    # where the timings follow: each peak is its process's own
    plans = ([{**common, "label": "all", "memory": [[mlp, "alone"], [mlp, "verify"]], "time": names, "traffic": names}] if quick else
             [{**common, "label": "alone-first", "memory": [[mlp, "alone"]]},
              {**common, "label": "verify-first", "memory": [[mlp, "verify"]], "traffic": names, "time": names}])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="accumlib-verify-ranks-") as out:
        try:
            got = [_launch(p, out) for p in plans]
        except Exception as err:
            return {"not_available": f"spawning {WORLD} loopback ranks failed: {type(err).__name__}: {str(err)[-300:]}"}
    launches_s = time.perf_counter() - t0
    ranks = [{k: v for r in (g[i] for g in got) for k, v in r.items()} for i in range(WORLD)]  # per rank, both launches merged
    for i in range(WORLD):
        ranks[i]["memory"] = {k: v for g in got for k, v in g[i].get("memory", {}).items()}
    activations = _activation_bytes(scale)
    rows = []
    for name in names:
        facts = ranks[0]["cases"][name]
        t = [r["time"][name] for r in ranks]
        alone, verified = t[0]["alone"], t[0]["verify"]  # rank 0's clock; the ranks wait on each other in every collective
        pair = [v / a for v, a in zip(verified, alone)]
        tr = [r["traffic"][name] for r in ranks]
        row: dict[str, Any] = {
            "model": name, **facts, "world_size": WORLD, "verdict_ok": all(x["ok"] for x in t) and all(x["ok"] for x in tr),
            "codes": t[0]["codes"], "steps": t[0]["steps"],
            "alone_s": statistics.median(alone), "verify_s": statistics.median(verified), "ratio": statistics.median(pair),
            "ratio_range": [min(pair), max(pair)], "alone_runs_s": alone, "verify_runs_s": verified, "repeats": repeats,
            # traffic: the worst rank (they are equal but for the gathered numbers' pickled sizes)
            "bytes_per_step": max(x["bytes_per_step"] for x in tr), "calls_per_step": max(x["calls_per_step"] for x in tr),
            "traffic_per_rank": tr,
        }
        row["bytes_over_params"] = row["bytes_per_step"] / facts["param_bytes"]
        row["traffic_limit_bytes"] = TRAFFIC_MAX_PARAMS * facts["param_bytes"] + TRAFFIC_SLACK
        row["traffic_met"] = row["bytes_per_step"] <= row["traffic_limit_bytes"]
        row["time_met"] = row["ratio"] <= TIME_MAX
        mem = [(r["memory"].get(f"{name}/alone"), r["memory"].get(f"{name}/verify")) for r in ranks]
        if all(a and v for a, v in mem):
            extra = [v["extra_peak_bytes"] - a["extra_peak_bytes"] for a, v in mem]
            limit = MEMORY_MAX_PARAMS * facts["param_bytes"] + activations
            row |= {"alone_peak_bytes": [a["extra_peak_bytes"] for a, _ in mem], "verify_peak_bytes": [v["extra_peak_bytes"] for _, v in mem],
                    "verify_extra_peak_bytes_per_rank": extra, "verify_extra_peak_bytes": max(extra),
                    "extra_over_params": max(extra) / facts["param_bytes"], "activation_bytes": activations,
                    "memory_limit_bytes": limit, "memory_met": max(extra) <= limit,
                    "exact_peak": all(a["exact_peak"] and v["exact_peak"] for a, v in mem)}
        rows.append(row)
        if verbose:
            print("    " + "  ".join(line_of(row)), flush=True)
    return {"rows": rows, "goals": goals(rows, quick), "launches_s": launches_s,
            "note": note(scale, rows, quick)}


def goals(rows: list[dict], quick: bool) -> dict:
    def judge(flag: str, value: Any, only: list[dict] | None = None) -> dict:
        judged = [r for r in (only if only is not None else rows) if flag in r]
        missed = [f"{r['model']}: {value(r)}" for r in judged if not r[flag]]
        measured = "; ".join(f"{r['model']}: {value(r)}" for r in judged) or "not measured"
        met = None if quick or not judged else not missed
        return {"measured": measured, "met": met, "missed": [] if quick else missed}

    out = {
        "verify_ranks_time": judge("time_met", lambda r: f"{r['ratio']:.2f}x ({r['verify_s']:.2f} / {r['alone_s']:.2f} s)"),
        "verify_ranks_memory": judge("memory_met", lambda r: (
            f"{_mb(r['verify_extra_peak_bytes'])} worst rank, {r['extra_over_params']:.1f}x the parameters "
            f"(goal {_mb(r['memory_limit_bytes'])})")),
        "verify_ranks_traffic": judge("traffic_met", lambda r: (
            f"{_mb(r['bytes_per_step'])} per step and rank, {r['bytes_over_params']:.2f}x the parameters "
            f"({r['calls_per_step']:.0f} calls)")),
    }
    if quick:
        for g in out.values():
            g["note"] = "--quick: tiny sizes, no verdict"
    return out


def note(scale: Scale, rows: list[dict], quick: bool) -> str:
    mlp = rows[0]
    return (f"{WORLD} gloo ranks on loopback, 1 thread each, the correct DDP loop of accumlib.examples.ddp_loops; "
            f"MLP {'-'.join(map(str, (scale.in_features, *scale.widths, scale.classes)))} ({mlp['param_count']:,} parameters, "
            f"{_mb(mlp['param_bytes'])}), k = {scale.k}, micro-batches of {scale.batch_size}, {scale.steps} optimizer steps per rank "
            f"(equal counts: no per-rank-mean all-reduce); lm-tokens: its task's k = 4, batches of 4, 64 sequences "
            f"(token counts differ between ranks: the per-rank-mean all-reduce runs). Time: rank 0's, median of "
            f"{mlp['repeats']} interleaved pairs, each of loop alone and verify warmed up once in the process first. Memory: per rank, "
            "peak resident memory (VmHWM) above the run's baseline (model and data built, a tiny MLP's runs done), the loop alone "
            "and verify each first in its own fresh launch; verify's extra = its peak - the loop's. Traffic: torch.distributed's "
            "Python collectives counted in each rank during verify's run (bytes this rank hands in: a tensor's, a gathered "
            "object's pickled size), per optimizer step; the loop's DDP gradient all-reduce (C++ reducer, unseen by such a "
            "count) counted apart by a DDP communication hook" + ("; --quick: tiny sizes, everything in one launch, no verdict" if quick else ""))


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if abs(n) >= 1e5 else f"{n / 1e3:.1f} kB"


def line_of(r: dict) -> list[str]:
    out = [f"{r['model']:<10}", f"time {r['ratio']:.2f}x ({r['verify_s']:.2f} / {r['alone_s']:.2f} s)"]
    if "verify_extra_peak_bytes" in r:
        out.append("verify's extra peak per rank " + ", ".join(_mb(x) for x in r["verify_extra_peak_bytes_per_rank"])
                   + f" ({r['extra_over_params']:.1f}x params)")
    ddp = r["traffic_per_rank"][0]["ddp_bytes_per_step"]
    out += [f"traffic {_mb(r['bytes_per_step'])}/step ({r['bytes_over_params']:.2f}x params {_mb(r['param_bytes'])}; "
            f"DDP's own {_mb(ddp)})", f"verdict {'ok' if r['verdict_ok'] else 'NOT ok: ' + ', '.join(r['codes'])}"]
    return out


def lines(res: dict, short: bool = False) -> list[str]:
    """The section as markdown: one row per model, the three goals per row."""
    head = ["model (parameter bytes)", "verdict", "loop alone", "verify", "ratio [range]", f"goal <= {TIME_MAX:g}x",
            "verify's extra peak per rank (x params)", "goal <= 5x + activations",
            "verify's traffic per step and rank: calls, bytes (x params)", "goal <= 4x + 64 KiB", "DDP's own gradient all-reduce per step"]
    body = []
    for r in res["rows"]:
        ddp = r["traffic_per_rank"][0]
        mem = ("not measured (16.8K parameters: below resident-memory noise)" if "verify_extra_peak_bytes" not in r else
               ", ".join(_mb(x) for x in r["verify_extra_peak_bytes_per_rank"]) + f" ({r['extra_over_params']:.1f}x)")
        body.append([f"{r['model']} ({_mb(r['param_bytes'])})", "ok" if r["verdict_ok"] else "NOT ok: " + ", ".join(r["codes"]),
                     f"{r['alone_s']:.2f} s", f"{r['verify_s']:.2f} s",
                     f"{r['ratio']:.2f}x [{r['ratio_range'][0]:.2f}, {r['ratio_range'][1]:.2f}]", _status(r.get("time_met")),
                     mem, _status(r.get("memory_met")) + (f" ({_mb(r['memory_limit_bytes'])})" if "memory_limit_bytes" in r else ""),
                     f"{r['calls_per_step']:.0f}, {_mb(r['bytes_per_step'])} ({r['bytes_over_params']:.2f}x)",
                     _status(r.get("traffic_met")),
                     f"{ddp['ddp_calls_per_step']:.0f} bucket(s), {_mb(ddp['ddp_bytes_per_step'])}"])
    out = md_table(head, body)
    if not short:
        out += ["", "verify's collectives per step and rank, by operation: " + "; ".join(
            f"{r['model']}: " + ", ".join(f"{op} {c:.0f} call(s), {_mb(b)} in all" for op, (c, b) in r["traffic_per_rank"][0]["per_op_per_step"].items())
            for r in res["rows"])]
    if not all(r.get("exact_peak", True) for r in res["rows"]):
        out += ["", "peaks sampled every 2 ms (the kernel's high-water mark could not be reset here): a short spike may be missed"]
    return out


def _status(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "not measured"}[met]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, one launch: checks the script, measures nothing for real")
    p.add_argument("--repeats", type=int, help="interleaved timing pairs per model (default 3; 1 with --quick)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    res = run(args.quick, args.repeats)
    if "not_available" in res:
        print(f"not available: {res['not_available']}")
        return res
    print("\n".join(lines(res)))
    print(f"\n{res['note']}\n")
    for key, g in res["goals"].items():
        print(f"  {_status(g['met']):<13} {key:<22} {g['measured']}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    import verify_ranks  # the ranks import rank_main from the module by name, never from __main__

    verify_ranks.main()
