"""Mutation testing: does the suite notice a real mistake?

Each mutant in ``tools/mutants/<group>.py`` is one hand-written, single-point change that models a
mistake someone could really make (a divisor k for m, a ``min`` turned into ``max``, a user's state not
copied, a check skipped, a tolerance loosened 10x). This script applies one mutant at a time to a
private copy of the working tree, runs the tests that cover its module there, and counts it *killed*
when they fail. A mutant the tests pass is a *survivor*: either a blind spot (write a behavioural
test) or an equivalent change (argue it in the mutant's ``equivalent`` field; it then leaves the
denominator). The score per group is killed / (total - equivalent).

    .venv/bin/python tools/mutate.py                 # every group
    .venv/bin/python tools/mutate.py hf lightning    # some groups
    .venv/bin/python tools/mutate.py hf --only 'num_items'   # mutants whose name contains it (not recorded)
    .venv/bin/python tools/mutate.py --list          # check the catalogue (every broken entry), nothing run

A whole group's run replaces that group's entry in ``tools/mutation.json`` and redraws
``tools/mutation.md``: the score per module, and every mutant not killed with its argument.

The working tree is never touched: tracked and untracked-but-not-ignored files are copied to a
temporary directory, which comes first on every sys.path (PYTHONPATH), so the editable install
still resolves ``accumlib`` to the mutated copy, in spawned ranks and kernels too. Bytecode is not
written there: two mutants of the same size written in the same second would otherwise share a
stale .pyc.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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
RECORD, PAGE = CATALOGUE.parent / "mutation.json", CATALOGUE.parent / "mutation.md"
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
    equivalent: str = ""  # why the change cannot alter behaviour; such a mutant leaves the score
    tests: tuple[str, ...] = ()  # overrides the group's TESTS

    def apply(self, text: str) -> str:
        n = text.count(self.old)
        if self.at is None and n != 1:
            raise ValueError(
                f"mutant {self.name!r}: old must occur exactly once in {self.file} (found {n}); "
                f"give at=<occurrence index>"
            )
        if self.at is not None and not 0 <= self.at < n:
            raise ValueError(f"mutant {self.name!r}: at must be in [0, {n}) for {self.file} (got {self.at})")
        i = -1
        for _ in range((self.at or 0) + 1):
            i = text.index(self.old, i + 1)
        return text[:i] + self.new + text[i + len(self.old) :]


def load(group: str):
    if str(CATALOGUE.parent) not in sys.path:
        sys.path.insert(0, str(CATALOGUE.parent))  # the catalogues import Mutant from this file
    spec = importlib.util.spec_from_file_location(f"mutants_{group}", CATALOGUE / f"{group}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def groups() -> list[str]:
    return sorted(p.stem for p in CATALOGUE.glob("*.py") if not p.stem.startswith("_"))


def problems(group: str, only: str = "") -> list[str]:
    """What keeps a group's catalogue from running: a test path or a mutant's file that does not exist,
    an ``old`` not found once (or at ``at``), a mutant that changes nothing or does not compile."""
    mod = load(group)
    out = [f"test path {t} does not exist" for t in mod.TESTS if not (ROOT / t.split("::")[0]).exists()]
    for m in (m for m in mod.MUTANTS if only in m.name):
        out += [
            f"mutant {m.name!r}: test path {t} does not exist"
            for t in m.tests
            if not (ROOT / t.split("::")[0]).exists()
        ]
        if not (ROOT / m.file).is_file():
            out.append(f"mutant {m.name!r}: {m.file} does not exist")
            continue
        text = (ROOT / m.file).read_text()
        try:
            mutated = m.apply(text)
            compile(mutated, m.file, "exec")
        except (ValueError, SyntaxError) as e:
            out.append(str(e) if str(e).startswith("mutant") else f"mutant {m.name!r}: {e}")
            continue
        if mutated == text:
            out.append(f"mutant {m.name!r}: old and new are the same text")
    return out


def copy_tree(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for f in filter(None, files):
        src = ROOT / f.decode()
        if src.is_file():
            (dest / f.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f.decode())


def run_tests(tree: Path, tests, extra, timeout: float) -> tuple[str, float, str]:
    env = os.environ | {"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    if (ROOT / ".venv" / "pycache").is_dir():  # the Makefile's bytecode of torch & co., read only
        env.setdefault("PYTHONPYCACHEPREFIX", str(ROOT / ".venv" / "pycache"))
    t = time.perf_counter()
    # its own session, so that a timeout kills spawned ranks and kernels with it
    p = subprocess.Popen(
        [sys.executable, *PYTEST, *extra, *tests],
        cwd=tree,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return "timeout", time.perf_counter() - t, f"no result within {timeout:.0f} s"
    except BaseException:
        # Ctrl-C, or SIGTERM (main turns it into SystemExit): the tests in their own session would run on,
        # orphaned, with their ranks and kernels; they end with this run
        os.killpg(p.pid, signal.SIGKILL)
        raise
    # pytest's exit codes: 0 all passed, 1 some failed, 2 interrupted or a collection error;
    # anything else (5: nothing collected) means the group's test list is wrong
    status = {0: "survived", 1: "killed", 2: "killed"}.get(p.returncode, f"error rc={p.returncode}")
    lines = [ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))] or out.strip().splitlines()[
        -1:
    ]
    return status, time.perf_counter() - t, (lines[0] if lines else "")


def main(argv=None) -> int:
    # a plain `kill` ends the run through run_tests' cleanup, as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("groups", nargs="*", help=f"groups to run (default all: {', '.join(groups())})")
    ap.add_argument(
        "--only", default="", help="run only mutants whose name contains this string (results not recorded)"
    )
    ap.add_argument("--list", action="store_true", help="check and print the catalogue, run nothing")
    a = ap.parse_args(argv)
    unknown = set(a.groups) - set(groups())
    if unknown:
        ap.error(f"groups must be among {', '.join(groups())} (got {', '.join(sorted(unknown))})")
    chosen = a.groups or groups()
    if a.list:
        broken = [f"{g}: {p}" for g in chosen for p in problems(g, a.only)]
        for g in chosen:
            for m in (m for m in load(g).MUTANTS if a.only in m.name):
                print(
                    f"{g:12} {m.file}: {m.name}" + (f"  [equivalent: {m.equivalent}]" if m.equivalent else "")
                )
        # every stale, ambiguous or broken entry at once, not just the first
        if broken:
            print("".join(f"\nbroken: {p}" for p in broken), file=sys.stderr)
            return 1
        return 0

    results = {}
    with tempfile.TemporaryDirectory(prefix="accumlib-mutants-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        for g in chosen:
            results[g] = run_group(g, tree, a.only)
            if results[g] is None:
                return 2
    if not a.only:  # a whole group's run replaces its entry in the record, and the page is redrawn
        record = json.loads(RECORD.read_text()) if RECORD.exists() else {}
        record.update(results)
        RECORD.write_text(json.dumps(dict(sorted(record.items())), indent=1) + "\n")
        PAGE.write_text(render(record))
        print(f"\nrecorded in {RECORD.relative_to(ROOT)}, {PAGE.relative_to(ROOT)}")
    rows = [r for g in results.values() for r in g["mutants"]]
    return 0 if all(r["status"] in ("killed", "equivalent") for r in rows) else 1


def run_group(g: str, tree: Path, only: str = "") -> dict | None:
    mod = load(g)
    extra = list(getattr(mod, "PYTEST_ARGS", ()))
    status, base, tail = run_tests(tree, mod.TESTS, extra, timeout=1800)
    if status != "survived":
        print(f"{g}: the unmutated tests do not pass ({status}: {tail}); fix them first", file=sys.stderr)
        return None
    print(f"{g}: baseline {base:.0f} s over {' '.join(mod.TESTS)}", flush=True)
    rows = []
    for m in (m for m in mod.MUTANTS if only in m.name):
        path = tree / m.file
        original = path.read_text()
        mutated = m.apply(original)
        try:  # a mutant that does not compile would be "killed" by an import error: a broken catalogue entry
            compile(mutated, m.file, "exec")
        except SyntaxError as e:
            print(f"{g}: mutant {m.name!r} does not compile ({e}); fix its old/new", file=sys.stderr)
            return None
        path.write_text(mutated)
        try:
            status, secs, tail = run_tests(tree, m.tests or mod.TESTS, extra, timeout=3 * base + 60)
        finally:
            path.write_text(original)
        if status == "survived" and m.equivalent:
            status = "equivalent"
        print(
            f"  {status:10} {secs:5.0f} s  {m.name}"
            + (f"\n             {tail}" if status == "killed" else ""),
            flush=True,
        )
        rows.append(
            {
                "name": m.name,
                "file": m.file,
                "status": status,
                "detail": tail if status == "killed" else "",
                "equivalent": m.equivalent,
            }
        )
    c = tally(rows)
    print(
        f"{g}: killed {c['killed']} (+{c['timeout']} by timeout) of {c['judged']} non-equivalent "
        f"({score(c)}); {c['equivalent']} equivalent",
        flush=True,
    )
    return {"tests": list(mod.TESTS), "baseline_s": round(base), "mutants": rows}


def tally(rows) -> dict:
    c = {k: sum(r["status"] == k for r in rows) for k in ("killed", "timeout", "survived", "equivalent")}
    c["survived"] += sum(r["status"].startswith("error") for r in rows)  # a wrong test list counts against
    c["judged"] = c["killed"] + c["timeout"] + c["survived"]
    return c


def score(c: dict) -> str:
    return f"{(c['killed'] + c['timeout']) / c['judged']:.0%}" if c["judged"] else "-"


def module_of(file: str) -> str:
    """accumlib/hf/trainer.py -> accumlib/hf/ (a package counts as one module); accumlib/harness.py stays."""
    parts = Path(file).parts
    return "/".join(parts[:2]) + "/" if len(parts) > 2 else file


def render(record: dict) -> str:
    rows = [r for g in record.values() for r in g["mutants"]]
    by_module: dict[str, list] = {}
    for r in rows:
        by_module.setdefault(module_of(r["file"]), []).append(r)
    lines = [
        "# Mutation score",
        "",
        "Written by `tools/mutate.py` from `tools/mutation.json` (each group's latest whole run). "
        "A mutant is",
        "killed when the tests that cover its module fail; *equivalent* mutants (argued in their catalogue,",
        "`tools/mutants/`) leave the score, which is killed / non-equivalent.",
        "",
        "| module | mutants | killed | timeout | survived | equivalent | score |",
        "|---|---|---|---|---|---|---|",
    ]

    def row(name: str, rs: list) -> str:
        c = tally(rs)
        counts = " | ".join(str(c[k]) for k in ("killed", "timeout", "survived", "equivalent"))
        return f"| {name} | {len(rs)} | {counts} | {score(c)} |"

    lines += [row(f"`{mod}`", rs) for mod, rs in sorted(by_module.items())]
    lines.append(row("all", rows))
    lines += ["", "| group | tests run per mutant | baseline |", "|---|---|---|"]
    lines += [f"| {g} | {' '.join(v['tests'])} | {v['baseline_s']} s |" for g, v in record.items()]
    rest = [r for r in rows if r["status"] != "killed"]
    if rest:
        lines += ["", "## Not killed", ""]
        lines += [
            f"- `{r['file']}`: {r['name']} ({r['status']})"
            + (f": {r['equivalent']}" if r["equivalent"] else "")
            for r in rest
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
