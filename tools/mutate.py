"""Mutation testing: does the suite notice a real mistake?

Each mutant in ``tools/mutants/<group>.py`` is one hand-written, single-point change that models a
mistake someone could really make (a divisor k for m, a ``min`` turned into ``max``, a user's state not
copied, a check skipped, a tolerance loosened 10x). This script applies one mutant at a time to a
private copy of the working tree, runs the tests that cover its module there, and counts it *killed*
when they fail. A mutant the tests pass is a *survivor*: either a blind spot (write a behavioural
test) or an equivalent change (argue it in the mutant's ``equivalent`` field; it then leaves the
denominator). The score per group is killed / (total - equivalent).

    .venv/bin/python tools/mutate.py                 # every group, writes tools/mutation.md
    .venv/bin/python tools/mutate.py hf lightning    # some groups (the file is not written)
    .venv/bin/python tools/mutate.py hf --only 'num_items'   # mutants whose name contains a string
    .venv/bin/python tools/mutate.py --list          # the catalogue, nothing run

The working tree is never touched: tracked and untracked-but-not-ignored files are copied to a
temporary directory, which comes first on every sys.path (PYTHONPATH), so the editable install
still resolves ``accumlib`` to the mutated copy, in spawned ranks and kernels too. Bytecode is not
written there: two mutants of the same size written in the same second would otherwise share a
stale .pyc.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = Path(__file__).resolve().parent / "mutants"
# pytest without the notebook and doctest collection of pyproject's addopts: each group names its
# own test files; a group that needs doctests or nbval says so in its PYTEST_ARGS.
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header"]


@dataclass(frozen=True)
class Mutant:
    """One mistake: ``old`` (which must occur exactly once in ``file``, or ``at`` picks the
    occurrence) becomes ``new``."""
    name: str
    file: str
    old: str
    new: str
    at: int | None = None
    equivalent: str = ""   # why the change cannot alter behaviour; such a mutant leaves the score
    tests: tuple[str, ...] = ()   # overrides the group's TESTS

    def apply(self, text: str) -> str:
        n = text.count(self.old)
        if self.at is None and n != 1:
            raise ValueError(f"mutant {self.name!r}: old must occur exactly once in {self.file} (found {n}); "
                             f"give at=<occurrence index>")
        if self.at is not None and not 0 <= self.at < n:
            raise ValueError(f"mutant {self.name!r}: at must be in [0, {n}) for {self.file} (got {self.at})")
        i = -1
        for _ in range((self.at or 0) + 1):
            i = text.index(self.old, i + 1)
        return text[:i] + self.new + text[i + len(self.old):]


def load(group: str):
    if str(CATALOGUE.parent) not in sys.path:
        sys.path.insert(0, str(CATALOGUE.parent))   # the catalogues import Mutant from this file
    spec = importlib.util.spec_from_file_location(f"mutants_{group}", CATALOGUE / f"{group}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def groups() -> list[str]:
    return sorted(p.stem for p in CATALOGUE.glob("*.py") if not p.stem.startswith("_"))


def copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for f in filter(None, files):
        src = ROOT / f.decode()
        if src.is_file():
            (dest / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f.decode())


def run_tests(tree: Path, tests, extra, timeout: float) -> tuple[str, float, str]:
    env = os.environ | {"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    if (ROOT / ".venv" / "pycache").is_dir():   # the Makefile's bytecode of torch & co., read only
        env.setdefault("PYTHONPYCACHEPREFIX", str(ROOT / ".venv" / "pycache"))
    t = time.perf_counter()
    # its own session, so that a timeout kills spawned ranks and kernels with it
    p = subprocess.Popen([sys.executable, *PYTEST, *extra, *tests], cwd=tree, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return "timeout", time.perf_counter() - t, f"no result within {timeout:.0f} s"
    # pytest's exit codes: 0 all passed, 1 some failed, 2 interrupted or a collection error;
    # anything else (5: nothing collected) means the group's test list is wrong
    status = {0: "survived", 1: "killed", 2: "killed"}.get(p.returncode, f"error rc={p.returncode}")
    lines = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))] or out.strip().splitlines()[-1:]
    return status, time.perf_counter() - t, (lines[0] if lines else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("groups", nargs="*", help=f"groups to run (default all: {', '.join(groups())})")
    ap.add_argument("--only", default="", help="run only mutants whose name contains this string")
    ap.add_argument("--list", action="store_true", help="print the catalogue and exit")
    ap.add_argument("--out", default=None, help="markdown results file (default tools/mutation.md when every group runs)")
    a = ap.parse_args(argv)
    unknown = set(a.groups) - set(groups())
    if unknown:
        ap.error(f"groups must be among {', '.join(groups())} (got {', '.join(sorted(unknown))})")
    chosen = a.groups or groups()
    out = Path(a.out) if a.out else (CATALOGUE.parent / "mutation.md" if not a.groups and not a.only else None)

    rows, table = [], []
    with tempfile.TemporaryDirectory(prefix="accumlib-mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        for g in chosen:
            mod = load(g)
            mutants = [m for m in mod.MUTANTS if a.only in m.name]
            if a.list:
                for m in mutants:
                    m.apply((ROOT / m.file).read_text())   # a stale or ambiguous `old` is an error here
                    print(f"{g:12} {m.file}: {m.name}" + (f"  [equivalent: {m.equivalent}]" if m.equivalent else ""))
                continue
            extra = list(getattr(mod, "PYTEST_ARGS", ()))
            status, base, tail = run_tests(tree, mod.TESTS, extra, timeout=1800)
            if status != "survived":
                print(f"{g}: the unmutated tests do not pass ({status}: {tail}); fix them first", file=sys.stderr)
                return 2
            print(f"{g}: baseline {base:.0f} s over {', '.join(mod.TESTS)}", flush=True)
            counts = {"killed": 0, "survived": 0, "equivalent": 0, "timeout": 0, "error": 0}
            for m in mutants:
                path = tree / m.file
                original = path.read_text()
                path.write_text(m.apply(original))
                try:
                    status, secs, tail = run_tests(tree, m.tests or mod.TESTS, extra, timeout=3 * base + 60)
                finally:
                    path.write_text(original)
                if status == "survived" and m.equivalent:
                    status = "equivalent"
                key = status if status in counts else "error"
                counts[key] += 1
                print(f"  {status:10} {secs:5.0f} s  {m.name}" + (f"\n             {tail}" if status == "killed" else ""), flush=True)
                rows.append((g, m, status, tail))
            judged = counts["killed"] + counts["survived"] + counts["timeout"] + counts["error"]
            score = (counts["killed"] + counts["timeout"]) / judged if judged else 1.0
            table.append((g, counts, judged, score))
            print(f"{g}: killed {counts['killed']} (+{counts['timeout']} by timeout) of {judged} non-equivalent "
                  f"({score:.0%}); {counts['equivalent']} equivalent", flush=True)
    if a.list:
        return 0
    md = render(table, rows)
    print("\n" + md)
    if out:
        out.write_text(md)
    return 0 if all(s == "killed" or s == "equivalent" for _, _, s, _ in rows) else 1


def render(table, rows) -> str:
    lines = ["# Mutation score", "", "Written by `tools/mutate.py` (every group). Score: killed / non-equivalent mutants.", "",
             "| group | killed | timeout | survived | equivalent | score |", "|---|---|---|---|---|---|"]
    for g, c, judged, score in table:
        lines.append(f"| {g} | {c['killed']} | {c['timeout']} | {c['survived'] + c['error']} | {c['equivalent']} | "
                     f"{c['killed'] + c['timeout']}/{judged} = {score:.0%} |")
    surv = [(g, m, s) for g, m, s, _ in rows if s not in ("killed",)]
    if surv:
        lines += ["", "## Not killed", ""]
        lines += [f"- **{g}** `{m.file}`: {m.name} — {s}" + (f": {m.equivalent}" if m.equivalent else "") for g, m, s in surv]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
