"""The per-rank side of ``verify_ranks`` (benchmark section 10): the model and data at a scale, the
loop cases, the collective-traffic counter, and ``rank_main``, which each spawned rank runs."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import pickle
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules, also in the spawned ranks

WORLD = 2
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


from _verify_scale_runs import build, item_losses  # noqa: E402  the same MLP and data, at this section's scales


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
        """The run to measure, as a zero-argument call; what the loop alone needs is built here, outside
        it."""
        import accumlib
        from accumlib_course.examples.ddp_loops import LOOPS

        fn = LOOPS["correct"](self.task)
        if mode == "verify":
            return lambda: accumlib.verify(
                fn,
                model=self.model,
                dataset=self.dataset,
                item_losses=self.task.item_losses,
                accum_steps=self.k,
                batch_size=self.batch_size,
                collate_fn=self.collate_fn,
                ranks="all",
            )
        # made before the run: verify's own copies are part of what verify adds
        net = copy.deepcopy(self.model)
        opt = torch.optim.SGD(net.parameters(), lr=0.05)  # verify's default optimizer
        loader = torch.utils.data.DataLoader(
            self.dataset, batch_size=self.batch_size, shuffle=False, collate_fn=self.collate_fn
        )
        return lambda: fn(net, opt, loader)


# --- counting what flows ----------------------------------------------------------------------------------

COUNTED = (
    "all_reduce",
    "broadcast",
    "all_gather_object",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "gather_object",
    "broadcast_object_list",
    "scatter",
    "reduce",
    "barrier",
)


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
            if (
                verify_dir in path
                and path.endswith("ranks.py")
                and f.f_code.co_name in ("step", "finish", "join")
            ):
                phase = {"step": "step", "finish": "end", "join": "start"}[f.f_code.co_name]
                break
            f = f.f_back
        return who or "loop", phase, caller

    def __enter__(self) -> Traffic:
        import torch.distributed as dist

        from accumlib_course.distributed.comm import count_allreduce

        for name in COUNTED:
            if not hasattr(dist, name):
                continue
            original = self._saved[name] = getattr(dist, name)

            def wrapped(*args: Any, _name: str = name, _fn: Any = original, **kwargs: Any) -> Any:
                if self._depth == 0:
                    who, phase, caller = self._where()
                    # DDP's buckets, through the hook below: counted there
                    if caller != "comm.py:_counting_allreduce":
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
        return {
            "steps": steps,
            "calls_per_step": step_calls / steps,
            "bytes_per_step": step_bytes / steps,
            "per_op_per_step": {op: [c / steps, b / steps] for op, (c, b) in per_op.items()},
            "verify_calls": verify_calls,
            "verify_bytes": verify_bytes,
            "verify_outside_steps_bytes": verify_bytes - step_bytes,
            "outside_steps": outside,
            "loop_python_calls_per_step": loop_calls / steps,
            "loop_python_bytes_per_step": loop_bytes / steps,
            "ddp_calls_per_step": ddp_calls / steps,
            "ddp_bytes_per_step": ddp_bytes / steps,
        }


# --- one rank ---------------------------------------------------------------------------------------------


def rank_main(rank: int, world: int, plan_json: str, out: str) -> None:
    """What each rank of one launch does: warm up, the peak of its first run, then timings, then counted
    runs."""
    import torch.distributed as dist
    from _peak import Peak

    plan = json.loads(plan_json)
    torch.set_num_threads(1)
    res: dict[str, Any] = {"rank": rank}
    warm = Case("warm", WARM)
    # one-time imports and allocations (DDP, gloo, verify's modules), before any baseline
    for mode in ("alone", "verify"):
        warm.prepare(mode)()
    cases = {
        name: Case(
            name,
            None
            if name == "lm-tokens"
            else Scale(**{**plan["scale"], "widths": tuple(plan["scale"]["widths"])}),
        )
        for name in plan["cases"]
    }

    ran: set[tuple[str, str]] = set()  # (model, mode) already run in this process: warm
    traffic = res["traffic"] = {}
    if plan.get("memory"):
        mem = res["memory"] = {}
        for name, mode in plan["memory"]:
            run = cases[name].prepare(mode)
            count = mode == "verify" and name in plan.get("traffic", [])
            dist.barrier()
            # entered outside the peak: its imports are not verify's
            with Traffic() if count else contextlib.nullcontext() as tr:
                with Peak() as peak:
                    report = run()
            mem[f"{name}/{mode}"] = {
                "extra_peak_bytes": peak.extra,
                "base_bytes": peak.base,
                "exact_peak": peak.exact,
            }
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
            # a warm-up of each not yet run here (first runs pay one-time costs)
            for mode in ("alone", "verify"):
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
                        oracle = report.oracle
            times[name] = {**t, "ok": all(oks), "codes": codes, "steps": steps, "oracle": oracle}

    res["cases"] = {
        name: {
            "param_count": sum(p.numel() for p in c.model.parameters()),
            "param_bytes": sum(p.numel() * p.element_size() for p in c.model.parameters()),
        }
        for name, c in cases.items()
    }
    with open(os.path.join(out, f"{plan['label']}-rank{rank}.json"), "w") as fh:
        json.dump(res, fh)
