"""The widget section's kernel client: one Jupyter kernel per notebook, each control changed in turn
through ``_widget_driver.Driver`` inside it, and what a learner would see counted from the replies."""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _widget_discovery import Found
from _widget_driver import _MARK

ROOT = Path(__file__).resolve().parent.parent
WIDGET_MAX_S = 0.5  # the goal, per control (median)
# changes per control: B A B A B A, so one first change, five repeats, and the control ends at its start
REPEATS = 6
BUDGET_S = 12.0  # a slow control stops after this many seconds of changes (with at least MIN_CHANGES done)
MIN_CHANGES = 2  # a first change and one repeat: the repeat shows whether a cache serves a value seen before
SLOW_CHANGE_S = 60.0  # a single change slower than this is not repeated
REQUEST_TIMEOUT_S = 600.0  # building a widget or one change that takes longer is reported, never waited on


# --- the client: one kernel per notebook --------------------------------------------------------------------


@dataclass
class Reply:
    """What one kernel request produced: the Driver's result line, and what a front end would show."""

    result: dict | None = None
    figures: int = 0  # PNG images displayed
    outputs: int = 0  # any other display: HTML, text, a widget
    errors: list[str] = field(default_factory=list)
    stderr: str = ""
    timed_out: bool = False


def _request(kc: Any, km: Any, code: str, timeout: float) -> Reply:
    msg_id = kc.execute(code, store_history=False)
    reply = Reply()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            km.interrupt_kernel()
            reply.timed_out = True
            timeout, deadline = 30.0, time.monotonic() + 30.0  # let the interrupted request finish
            continue
        try:
            msg = kc.get_iopub_msg(timeout=min(left, 5.0))
        except Exception:  # queue.Empty: nothing yet
            if not km.is_alive():
                reply.errors.append("the kernel died")
                return reply
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "idle":
            return reply
        if kind == "comm_msg" and "outputs" in content.get("data", {}).get("state", {}):
            # an Output widget filled by setting its ``outputs`` (``_style.show_in``): the front end shows
            # these
            for o in content["data"]["state"]["outputs"]:
                _tally(reply, o["output_type"], o)
        else:
            _tally(reply, kind, content)


def _tally(reply: Reply, kind: str, content: dict) -> None:
    """Count one output (an IOPub message, or an entry of an Output widget's ``outputs``) as a learner sees
    it."""
    if kind == "stream":
        text = content["text"] if isinstance(content["text"], str) else "".join(content["text"])
        for line in text.splitlines():
            if line.startswith(_MARK):
                reply.result = json.loads(line[len(_MARK) :])
            elif content["name"] == "stderr":
                reply.stderr += line + "\n"
            elif re.match(r"^\w+(Error|Exception)\b.*:", line):  # Explorer shows a callback's error as text
                reply.errors.append(line)
            elif line.strip():
                reply.outputs += 1
    elif kind in ("display_data", "execute_result", "update_display_data"):
        data = content["data"]
        if "image/png" in data or "<img" in "".join(data.get("text/html", "")):
            reply.figures += 1
        else:
            reply.outputs += 1
    elif kind == "error":
        reply.errors.append(f"{content['ename']}: {content['evalue']}")


def _kernel(threads: int) -> tuple[Any, Any]:
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")  # "python" in the spec is this interpreter
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env.pop("MPLBACKEND", None)  # the kernel's default, the inline backend, as in JupyterLab
    # the kernel's own log (its start-up notices) goes to a file; what the widgets print comes over IOPub
    log = tempfile.NamedTemporaryFile("w", prefix="widget-bench-kernel-", suffix=".log", delete=False)
    km.start_kernel(cwd=str(ROOT / "notebooks"), env=env, stdout=log, stderr=log)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
    except RuntimeError as err:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        raise RuntimeError(f"{err} (the kernel's log: {log.name})") from err
    setup = (
        "%matplotlib inline\n"
        # torch takes its thread count from OMP_NUM_THREADS when a lesson imports it
        "import importlib.util, sys\n_spec = "
        "importlib.util.spec_from_file_location('accumlib_bench_widgets', "
        f"{str(Path(__file__).resolve().with_name('_widget_driver.py'))!r})\n_bench = "
        "importlib.util.module_from_spec(_spec); sys.modules[_spec.name] = _bench; "
        "_spec.loader.exec_module(_bench)\n"
    )
    r = _request(kc, km, setup, 120)
    if r.errors:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        raise RuntimeError(f"kernel setup failed: {r.errors} (the kernel's log: {log.name})")
    os.unlink(log.name)  # it started: what the widgets print comes over IOPub
    return km, kc


def _stats(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=4, method="inclusive") if len(times) > 1 else [times[0]] * 3
    return {"median_s": statistics.median(times), "quartiles_s": [q[0], q[2]], "n": len(times)}


def drive(
    found: list[Found],
    *,
    threads: int = 1,
    repeats: int = REPEATS,
    budget_s: float = BUDGET_S,
    min_changes: int = MIN_CHANGES,
    log: Any = print,
) -> tuple[list[dict], list[dict]]:
    """Rows, one per control of every widget; and the widgets that could not be built or driven, with why."""
    rows, unavailable = [], []
    by_notebook: dict[str, list[Found]] = {}
    for f in found:
        by_notebook.setdefault(f.notebook, []).append(f)
    for notebook, widgets in by_notebook.items():
        try:
            km, kc = _kernel(threads)
        except Exception as err:  # no kernel, no figures: said per widget, never a number
            unavailable += [
                asdict(f) | {"widget": f.name, "not_available": f"no kernel: {type(err).__name__}: {err}"}
                for f in widgets
            ]
            continue
        try:
            for n, f in enumerate(widgets):
                var = f"_driver{n}"
                code = (
                    f"{var} = _bench.Driver({f.module!r}, {f.builder!r}, {list(f.args)!r}, "
                    f"{dict(f.kwargs)!r})\n{var}.describe()"
                )
                built = _request(kc, km, code, REQUEST_TIMEOUT_S)
                if built.result is None:
                    why = "; ".join(built.errors) or ("timed out" if built.timed_out else "no result")
                    unavailable.append(asdict(f) | {"widget": f.name, "not_available": why})
                    log(f"    {notebook:<36} {f.name:<28} not available: {why}")
                    continue
                if not built.result["controls"]:
                    unavailable.append(asdict(f) | {"widget": f.name, "not_available": "no control to drive"})
                for i, c in enumerate(built.result["controls"]):
                    row = _drive_control(kc, km, var, i, f, c, built.result, repeats, budget_s, min_changes)
                    rows.append(row)
                    log("    " + _line(row))
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
    return rows, unavailable


def _drive_control(
    kc: Any,
    km: Any,
    var: str,
    i: int,
    f: Found,
    c: dict,
    built: dict,
    repeats: int,
    budget_s: float,
    min_changes: int,
) -> dict:
    times, firsts, figures, outputs, errors, stderr, processes = [], [], 0, 0, [], "", 0
    spent = 0.0
    while len(times) < repeats and (len(times) < min_changes or spent < budget_s):
        r = _request(kc, km, f"{var}.change({i})", REQUEST_TIMEOUT_S)
        errors += r.errors
        stderr += r.stderr
        if r.result is None:
            break
        if r.result["error"]:
            errors.append(r.result["error"])
        times.append(r.result["seconds"])
        firsts.append(r.result["first"])
        spent += r.result["seconds"]
        figures, outputs, processes = (
            figures + r.figures,
            outputs + r.outputs,
            processes + r.result["processes"],
        )
        if processes or r.result["seconds"] > SLOW_CHANGE_S:
            break  # a Run that starts processes, or a change of minutes: one is its figure
    _request(kc, km, f"{var}.restore({i})", REQUEST_TIMEOUT_S)
    row = {
        "notebook": f.notebook,
        "widget": f.name,
        "main": f.main,
        "control": c["control"],
        "class": c["class"],
        "change": "press" if c["how"] == "press" else f"{c['values'][0]} <-> {c['values'][1]}",
        "times_s": times,
        "first_s": times[0] if times else None,
        "repeat_median_s": statistics.median(times[1:]) if len(times) > 1 else None,
        "shown": "figure" if figures else "other output" if outputs else "nothing",
        "processes": processes,
        "errors": errors[:3],
        "stderr": stderr[-300:],
        "build_s": built["build_s"],
        "built_with": built["built_with"],
        "not_driven": built["skipped"],
    }
    if times:
        row |= _stats(times)
    if errors or not times:
        row["status"] = "ERROR"
    elif processes:
        row["status"] = "exempt"  # starts processes: behind a Run button, its time stated
    elif not figures and not outputs:
        row["status"] = "no redraw"  # an input a button reads
    else:
        row["status"] = "met" if row["median_s"] <= WIDGET_MAX_S else "MISSED"
    return row


def _line(row: dict) -> str:
    if "median_s" not in row:
        errors = "; ".join(row["errors"])[:100]
        return f"{row['notebook'][:2]} {row['widget']:<26} {row['control']:<18} ERROR: {errors}"
    q = row["quartiles_s"]
    first = "" if row["first_s"] is None else f"first {row['first_s']:.3f} s"
    return (
        f"{row['notebook'][:2]} {row['widget']:<26} {row['control']:<18} {row['class']:<15} median "
        f"{row['median_s']:7.3f} s [{q[0]:.3f}, {q[1]:.3f}] n={row['n']}  {first:<16} {row['shown']:<12} "
        f"{row['status']}" + (f"  ({row['processes']} processes)" if row["processes"] else "")
    )
