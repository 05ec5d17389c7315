"""Section 13, ``accumlib run`` on nanoGPT's own ``train.py``: its tiny config, 20 iterations, against the
script alone, on 1 process and on 2 gloo ranks.

nanoGPT's files are read at run time from a clone (``ACCUMLIB_NANOGPT_SRC``, pinned by commit and sha256 in
``tests/_nanogpt.py``, never committed here); without one the section is "not available". Time is the
script's own: the sum of the per-iteration times train.py prints (``iter N: loss L, time T ms``) for
iterations 1..20, so process start-up, imports and iteration 0's evaluation are left out, alike for both.
On 1 process the run is in this process, as ``accumlib run`` runs it (``runpy`` as ``__main__``, under
``accumlib.watch``), so the engine's extra bytes are read off the engine itself (its one sum per
parameter, against the parameters' bytes); on 2 ranks, ``torchrun -m accumlib run`` and the script
alone under torchrun, timed by rank 0's iteration lines. Alone and under accumlib are interleaved.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import runpy
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import _nanogpt as ng  # noqa: E402
from _render import md_table  # noqa: E402

NAME = "run_nanogpt"
TITLE = "13. accumlib run on nanoGPT's own train.py (tiny config, 20 iterations)"
TIME_MAX, MEMORY_MAX = 1.2, 1.0
LIMIT = TIME_MAX
GOALS = {
    "run_nanogpt_time": "accumlib run / the script alone <= 1.2 (median), nanoGPT's train.py, 1 process and "
    "2 ranks",
    "run_nanogpt_memory": "the engine's extra bytes <= 1x the parameters' bytes (1 process)",
}
ITERS = 20
FLAGS = [f"--max_iters={ITERS}", f"--lr_decay_iters={ITERS}"]
# what train.py prints each iteration on rank 0: "iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, .."
TIME_LINE = re.compile(r"^iter (\d+): loss \d+\.\d+, time (\d+\.\d+)ms", re.M)


def _seconds(out: str) -> float:
    """The sum of train.py's own per-iteration times, iterations 1..ITERS (iteration 0 evaluates)."""
    times = [float(t) for n, t in TIME_LINE.findall(out) if int(n) >= 1]
    if len(times) != ITERS:
        raise RuntimeError(
            f"expected {ITERS} timed iterations from train.py, read {len(times)}:\n{out[-2000:]}"
        )
    return sum(times) / 1000


def _in_process(train: Path, work: Path, watched: bool) -> tuple[float, int, int, bool]:
    """train.py as `python train.py config flags` (or as `accumlib run` runs it): its seconds, the engine's
    bytes, the parameters' bytes, and the verdict (True alone)."""
    import accumlib

    argv, path, cwd = list(sys.argv), list(sys.path), os.getcwd()
    sys.argv = ng.command(train, FLAGS)
    sys.path.insert(0, str(train.parent))
    os.chdir(work)
    out, held, params, ok = io.StringIO(), 0, 0, True
    try:
        with contextlib.redirect_stdout(out):
            if watched:
                with accumlib.watch(scan=False) as seen:
                    runpy.run_path(str(train), run_name="__main__")
                held = sum(x.numel() * x.element_size() for x in seen.engine.sums.values())
                params = sum(p.numel() * p.element_size() for p in seen.engine.params.values())
                ok = bool(seen.report.ok)
            else:
                runpy.run_path(str(train), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, path
        os.chdir(cwd)
    return _seconds(out.getvalue()), held, params, ok


def _ranks(train: Path, work: Path, watched: bool) -> tuple[float, bool]:
    if watched:
        argv = ng.torchrun_under_accumlib_command(FLAGS, train=train)
    else:
        argv = ng.torchrun_command(FLAGS, train=train)
    done = ng.run(argv, cwd=work, timeout=300)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"torchrun exited {done.returncode}:\n{done.stderr[-3000:]}")
    return _seconds(done.stdout), done.returncode == 0


def run(quick: bool = False) -> dict:
    src = ng.source()
    if src is None:
        return {
            "not_available": f"set {ng.SOURCE_ENV} to a clone of karpathy/nanoGPT at {ng.NANOGPT_COMMIT[:7]}"
        }
    repeats = 1 if quick else 5
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        scripts = ng.script_dir(Path(tmp), src)
        work = ng.make_workdir(Path(tmp) / "work", scripts)
        pairs: dict[str, list[float]] = {"alone": [], "watch": []}
        held = params = 0
        ok = True
        for r in range(repeats + 1):  # the first pair warms caches and is dropped
            for name in ("alone", "watch") if r % 2 == 0 else ("watch", "alone"):
                seconds, h, p, good = _in_process(scripts / "train.py", work, name == "watch")
                if name == "watch":
                    held, params, ok = h, p, good
                if r:
                    pairs[name].append(seconds)
        rows.append(_row("1 process", pairs, ok, held / params))
        if not quick:
            train = ng.ddp_copy(scripts, Path(tmp))
            pairs = {"alone": [], "watch": []}
            for r in range(3):
                for name in ("alone", "watch") if r % 2 == 0 else ("watch", "alone"):
                    seconds, good = _ranks(train, work, name == "watch")
                    pairs[name].append(seconds)
                    ok = good if name == "watch" else ok
            rows.append(_row("2 gloo ranks", pairs, ok, None))
    worst = max(r["ratio"] for r in rows)
    memory = rows[0]["extra_over_params"]
    return {
        "rows": rows,
        "goals": {
            "run_nanogpt_time": {
                "measured": " / ".join(f"{r['ratio']:.2f}x ({r['where']})" for r in rows),
                "met": None if quick else worst <= TIME_MAX,
                "missed": [] if quick or worst <= TIME_MAX else [f"{worst:.2f}x"],
            },
            "run_nanogpt_memory": {
                "measured": f"{memory:.2f}x the parameters' bytes",
                "met": None if quick else memory <= MEMORY_MAX,
                "missed": [] if quick or memory <= MEMORY_MAX else [f"{memory:.2f}x"],
            },
        },
        "note": f"train.py's own per-iteration times summed over iterations 1..{ITERS} (median over "
        "interleaved pairs); the engine's bytes read off the engine on 1 process"
        + ("; --quick: 1 repeat" if quick else ""),
    }


def _row(where: str, pairs: dict[str, list[float]], ok: bool, extra: float | None) -> dict[str, Any]:
    ratios = sorted(w / a for w, a in zip(pairs["watch"], pairs["alone"]))
    return {
        "where": where,
        "alone_s": statistics.median(pairs["alone"]),
        "watch_s": statistics.median(pairs["watch"]),
        "ratio": statistics.median(ratios),
        "ratio_range": [ratios[0], ratios[-1]],
        "extra_over_params": extra,
        "verdict_ok": ok,
        "repeats": len(ratios),
    }


def lines(res: dict, short: bool = False) -> list[str]:
    """This section's figures as markdown (``short``: the README's selection, here the same)."""
    return md_table(
        [
            "run",
            "script alone",
            "under accumlib run",
            "ratio [range]",
            "extra memory",
            "verdict",
            "goal <= 1.2x",
        ],
        [
            [
                r["where"],
                f"{r['alone_s']:.3f} s",
                f"{r['watch_s']:.3f} s",
                f"{r['ratio']:.2f}x [{r['ratio_range'][0]:.2f}, {r['ratio_range'][1]:.2f}]",
                "-" if r["extra_over_params"] is None else f"{r['extra_over_params']:.2f}x params",
                "ok" if r["verdict_ok"] else "NOT ok",
                "met" if r["ratio"] <= TIME_MAX else "MISSED",
            ]
            for r in res["rows"]
        ],
    )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    result = run(p.parse_args().quick)
    print("\n".join(lines(result)) if "rows" in result else f"not available: {result['not_available']}")
    print(result.get("goals"))
