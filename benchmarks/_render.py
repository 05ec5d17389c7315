"""Rendering shared by the sections: markdown tables, the goals table, the README's Performance section and
the summary figure. Reads section results (plain dicts) and each section module's NAME, TITLE, GOALS, LIMIT.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: figures are drawn to pixels, never shown
import matplotlib.pyplot as plt  # noqa: E402


def goals_table(results: dict, modules: dict[str, Any]) -> list[dict]:
    """One entry per goal a section module states (its ``GOALS``): met, MISSED, or not measured (with the
    reason)."""
    section_of = {key: name for name, mod in modules.items() for key in mod.GOALS}
    table = []
    for key, text in ((k, t) for mod in modules.values() for k, t in mod.GOALS.items()):
        res = results.get(section_of[key])
        entry: dict[str, Any] = {"goal": key, "section": section_of[key], "target": text}
        if res is None:
            entry |= {"status": "not measured", "met": None, "measured": "section not run"}
        elif "not_available" in res:
            entry |= {
                "status": "not measured",
                "met": None,
                "measured": f"not available: {res['not_available']}",
            }
        else:
            g = res["goals"][key]
            entry |= {
                "met": g["met"],
                "measured": g["measured"],
                "missed": g.get("missed", []),
                "status": {True: "met", False: "MISSED", None: "not measured"}[g["met"]],
            }
            if g.get("note"):
                entry["note"] = g["note"]
        table.append(entry)
    return table


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def md_table(head: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"] + [
        "| " + " | ".join(str(c) for c in r) + " |" for r in rows
    ]


def headline(sections: dict, k: int = 8) -> list[str]:
    """The trade in one sentence: at k, the share of activations kept and the step time paid, per model."""
    mem = {r["model"]: r["ratio"] for r in sections.get("memory", {}).get("rows", []) if r["k"] == k}
    price = {
        r["model"]: r["ratio_to_k1"]
        for r in sections.get("price", {}).get("rows", [])
        if r["k"] == k and r["device"] == "cpu"
    }
    models = [m for m in mem if m in price]
    if not models:
        return []
    parts = ", ".join(
        f"{m} {mem[m]:.3f} of the activations for {price[m]:.2f}x the step time" for m in models
    )
    return [f"The trade at k = {k} (same effective batch, CPU): {parts}.", ""]


def section_lines(name: str, res: dict, modules: dict[str, Any], short: bool = False) -> list[str]:
    """A section's figures as markdown, with its note; a section that could not run says why."""
    if "not_available" in res:
        return [f"not available: {res['not_available']}"]
    lines = modules[name].lines(res, short=short)
    if res.get("note"):
        lines += ["", f"_{res['note']}_"]
    return lines


def markdown(report: dict, modules: dict[str, Any]) -> str:
    m = report["machine"]
    contaminated = report.get("busy_warning")
    lines = [
        "## Performance",
        "",
        f"Produced by `make bench` on {m['date_utc']} UTC at commit {m['commit']}: {m['cpu']}, {m['cores']} "
        f"cores, torch {m['torch']} ({m['torch_threads']} thread{'s' if m['torch_threads'] != 1 else ''}), "
        f"Python {m['python']}"
        + (f", CUDA {m['cuda']}" if m["cuda"] else ", no CUDA device")
        + f". Whole run: {report['wall_s']:.0f} s.",
        "",
    ]
    if contaminated:
        lines += [f"> **Warning:** {contaminated}", ""]
    if report.get("carried"):
        lines += [
            "Sections kept from earlier runs (`--merge`): "
            + ", ".join(
                f"{name} ({c['date_utc']} UTC, commit {c['commit']})" for name, c in report["carried"].items()
            )
            + ".",
            "",
        ]
    lines += headline(report["sections"])
    lines += ["### Goals", ""]
    lines += md_table(
        ["goal", "target", "measured", "status"],
        [
            [
                g["goal"],
                g["target"],
                g["measured"],
                f"**{g['status']}**" if g["status"] == "MISSED" else g["status"],
            ]
            for g in report["goals"]
        ],
    )
    for name, res in report["sections"].items():
        lines += ["", f"### {modules[name].TITLE}", ""] + section_lines(name, res, modules, short=True)
    return "\n".join(lines) + "\n"


def figure(report: dict, path: Path, modules: dict[str, Any]) -> None:
    """Memory ratio and step-time ratio against k, overhead ratios, notebook and widget times."""
    s = report["sections"]
    limit = {name: getattr(mod, "LIMIT", None) for name, mod in modules.items()}
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    if "rows" in s.get("memory", {}):
        for model in dict.fromkeys(r["model"] for r in s["memory"]["rows"]):
            rows = [r for r in s["memory"]["rows"] if r["model"] == model]
            ax.plot([r["k"] for r in rows], [r["ratio"] for r in rows], "o-", label=model)
        ks = sorted({r["k"] for r in s["memory"]["rows"]})
        ax.plot(ks, [1 / k + limit["memory"] for k in ks], "k--", lw=1, label="goal 1/k + 0.05")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.legend()
    ax.set(title="1. activations per micro-batch / full batch", xlabel="k")
    ax = axes[0][1]
    if "rows" in s.get("price", {}):
        for key in dict.fromkeys((r["device"], r["model"]) for r in s["price"]["rows"]):
            rows = [r for r in s["price"]["rows"] if (r["device"], r["model"]) == key]
            ax.plot([r["k"] for r in rows], [r["ratio_to_k1"] for r in rows], "o-", label=" ".join(key))
        ax.legend()
    ax.set(title="3. step time, k micro-batches / one large batch", xlabel="k")
    ax = axes[1][0]
    bars = []
    if "rows" in s.get("overhead", {}):
        bars += [
            (f"{r['loop']} {r['task'].split('-')[0]}", r["ratio"], limit["overhead"], r["ratio_quartiles"])
            for r in s["overhead"]["rows"]
            if r["device"] == "cpu"
        ]
    if "rows" in s.get("verify", {}):
        bars += [
            (
                f"verify {r['loop'].removeprefix('correct-')}",
                r["ratio"],
                limit["verify"],
                r["ratio_quartiles"],
            )
            for r in s["verify"]["rows"]
        ]
    if bars:
        # quartiles of the pair ratios
        err = [[max(0.0, b[1] - b[3][0]) for b in bars], [max(0.0, b[3][1] - b[1]) for b in bars]]
        ax.barh(
            [b[0] for b in bars],
            [b[1] for b in bars],
            xerr=err,
            color=["C0" if b[1] <= b[2] else "C3" for b in bars],
        )
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
    ax.set(title="2 & 4. time ratios, quartiles (red: goal missed)", xlabel="ratio to the baseline")
    ax = axes[1][1]
    bars = []
    if "rows" in s.get("notebook_times", {}):
        bars += [
            (Path(r["notebook"]).stem[:24], r["wall_s"], limit["notebook_times"])
            for r in s["notebook_times"]["rows"]
        ]
    if "rows" in s.get("widgets", {}):
        # each widget's slowest control held to the goal (every control: latest.md)
        slowest: dict[str, dict] = {}
        for r in s["widgets"]["rows"]:
            if r.get("status") in ("met", "MISSED") and r["median_s"] > slowest.get(
                r["notebook"][:2] + " " + r["widget"], {}
            ).get("median_s", -1):
                slowest[r["notebook"][:2] + " " + r["widget"]] = r
        bars += [
            (f"{key[:2]} {r['widget'].rsplit('.', 1)[-1]}: {r['control']}", r["median_s"], limit["widgets"])
            for key, r in slowest.items()
        ]
    if bars:
        ax.barh(
            [b[0] for b in bars], [b[1] for b in bars], color=["C0" if b[1] <= b[2] else "C3" for b in bars]
        )
        ax.set_xscale("log")
    ax.set(title="5 & 6. nbval wall, widget controls (red: missed)", xlabel="seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
