"""Widget response, step 2: the driver, loaded inside the Jupyter kernel (see widgets.py).

It builds one widget, finds every control in its tree, changes each in turn between its start value
and a neighbour, and prints one result line per change (``@@widget-bench {json}``) that the client reads.
It imports nothing from the benchmarks, so the kernel loads it from its file alone.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

_DEVICE, _VARIABLE = "<device>", "<notebook variable>"  # markers for arguments discovery could not keep
_MARK = "@@widget-bench "  # the Driver's result line on the kernel's stdout


# --- 2. the driver, run inside the kernel -----------------------------------------------------------------


def _controls(obj: Any) -> list[tuple[str, Any]]:
    """(name, control) for every control a user can operate in the widget, in display order, buttons last."""
    import ipywidgets as w

    root = obj if isinstance(obj, w.Widget) else getattr(obj, "widget", None)
    named = {id(c): n for n, c in (getattr(obj, "controls", None) or {}).items()}
    found: list[Any] = []

    def walk(x: Any) -> None:
        if isinstance(x, w.Widget) and x.has_trait("disabled") and not x.disabled and x not in found:
            found.append(x)  # every control a user operates has ``disabled``; labels, outputs, images do not
        for child in getattr(x, "children", ()):
            walk(child)

    if root is not None:
        walk(root)
    for c in (getattr(obj, "controls", None) or {}).values():  # controls kept outside the tree, if any
        if isinstance(c, w.Widget) and c not in found:
            found.append(c)
    found.sort(key=lambda c: isinstance(c, w.Button))
    out = []
    for i, c in enumerate(found):
        label = named.get(id(c)) or getattr(c, "description", "") or f"{type(c).__name__} {i}"
        out.append((label, c))
    return out


def _values(control: Any) -> tuple[str, Any, Any] | None:
    """(what changes, start value A, neighbour B) for a control; None for one this driver cannot move."""
    import ipywidgets as w

    if isinstance(control, w.Button):
        return "press", None, None
    # Dropdown, RadioButtons, ToggleButtons, SelectionSlider
    if control.has_trait("index") and control.has_trait("options"):
        n, a = len(control.options), control.index
        if n < 2 or a is None or isinstance(a, tuple):
            return None
        return "index", a, a + 1 if a + 1 < n else a - 1
    value = control.value
    if isinstance(value, bool):  # Checkbox, ToggleButton
        return "value", value, not value
    if isinstance(value, str):  # Text, Textarea: a neutral edit, as a learner's typing would trigger
        return "value", value, value + ("\n" if isinstance(control, w.Textarea) else " ")
    # range sliders: move the upper end
    if isinstance(value, tuple) and len(value) == 2 and control.has_trait("step"):
        lo, hi = value
        up = hi + control.step if hi + control.step <= control.max else hi - control.step
        return "value", value, (lo, max(lo, up))
    if isinstance(value, (int, float)):
        step = control.step if control.has_trait("step") and control.step else 1
        if control.has_trait("base"):  # FloatLogSlider: min, max and step are exponents
            e = math.log(value, control.base)
            e_new = e + step if e + step <= control.max + 1e-9 else e - step
            return "value", value, control.base**e_new
        if control.has_trait("max") and value + step > control.max:
            return "value", value, value - step
        return "value", value, value + step
    return None


class Driver:
    """The widget ``module.builder(...)``, built in the kernel; ``change(i)`` moves control i once and times
    it."""

    def __init__(self, module: str, builder: str, args: list, kwargs: dict):
        import importlib
        import inspect

        fn = getattr(importlib.import_module(module), builder)
        params = inspect.signature(fn).parameters
        names = list(params)
        given = dict(zip(names, args)) | kwargs
        call, left_out = {}, []
        for name, value in given.items():
            if value == _DEVICE or (name == "device" and value == _VARIABLE):
                call[name] = "cpu"  # the goal is on CPU
            elif value == _VARIABLE:
                left_out.append(name)  # a notebook variable (``initial=result``): the widget computes it
                if params[name].default is inspect.Parameter.empty:
                    raise ValueError(
                        f"{module}.{builder} needs {name}, a notebook variable the benchmark cannot rebuild"
                    )
            else:
                call[name] = value
        if "device" in params and "device" not in call:
            call["device"] = "cpu"
        self._processes = _count_processes()
        t0 = time.perf_counter()
        self.widget = fn(**call)
        self.build_s = time.perf_counter() - t0
        import ipywidgets as w

        if not isinstance(self.widget, w.Widget) and not isinstance(
            getattr(self.widget, "widget", None), w.Widget
        ):
            raise TypeError(f"{module}.{builder} returned {type(self.widget).__name__}, not a widget")
        self.built_with = {k: repr(v) for k, v in call.items()} | {
            k: "left out: a notebook variable" for k in left_out
        }
        self.controls = []
        self.skipped = []
        for label, control in _controls(self.widget):
            values = _values(control)
            if values is None:
                self.skipped.append(f"{label} ({type(control).__name__})")
            else:
                self.controls.append((label, control, *values))
        self.changes = [0] * len(self.controls)

    def describe(self) -> None:
        print(
            _MARK
            + json.dumps(
                {
                    "build_s": self.build_s,
                    "built_with": self.built_with,
                    "skipped": self.skipped,
                    "controls": [
                        {
                            "control": label,
                            "class": type(c).__name__,
                            "how": how,
                            "values": [] if how == "press" else [_shown(c, how, a), _shown(c, how, b)],
                        }
                        for label, c, how, a, b in self.controls
                    ],
                }
            )
        )

    def change(self, i: int) -> None:
        """Move control i to B on even changes and back to A on odd ones (or press it); print the seconds."""
        label, control, how, a, b = self.controls[i]
        n = self.changes[i]
        self.changes[i] += 1
        started = self._processes[0]
        error = None
        t0 = time.perf_counter()
        try:
            if how == "press":
                control.click()
            else:
                setattr(control, how, b if n % 2 == 0 else a)
        # a callback that raises: in JupyterLab it lands in the log and nothing redraws
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        seconds = time.perf_counter() - t0
        print(
            _MARK
            + json.dumps(
                {
                    "seconds": seconds,
                    "first": n == 0,
                    "processes": self._processes[0] - started,
                    "error": error,
                }
            )
        )

    def restore(self, i: int) -> None:
        """Put control i back at its start value, untimed (after an odd number of changes)."""
        label, control, how, a, b = self.controls[i]
        if how != "press" and self.changes[i] % 2 == 1:
            setattr(control, how, a)
            self.changes[i] += 1


def _shown(control: Any, how: str, value: Any) -> str:
    """A value as the learner reads it: the option, not its index; floats to four digits."""
    value = control.options[value] if how == "index" else value
    # (label, value) options
    value = value[0] if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) else value
    return f"{value:.4g}" if isinstance(value, float) else repr(value)[:40]


def _count_processes() -> list[int]:
    """A counter of the processes started in this kernel from now on (subprocess, multiprocessing, fork)."""
    import multiprocessing.process
    import subprocess

    counter = [0]
    if getattr(subprocess.Popen, "_bench_counter", None) is None:

        def counted(original: Any) -> Any:
            def wrapper(*a: Any, **kw: Any) -> Any:
                for c in wrapper._bench_counters:
                    c[0] += 1
                return original(*a, **kw)

            wrapper._bench_counters = []
            return wrapper

        subprocess.Popen.__init__ = counted(subprocess.Popen.__init__)
        multiprocessing.process.BaseProcess.start = counted(multiprocessing.process.BaseProcess.start)
        subprocess.Popen._bench_counter = True
    subprocess.Popen.__init__._bench_counters.append(counter)
    multiprocessing.process.BaseProcess.start._bench_counters.append(counter)
    return counter
