"""Mutation testing: does the suite notice a real mistake?

Each mutant in ``tools/mutants/<group>.py`` is one single-point change that models a mistake someone
could really make (a divisor k for m, a ``min`` turned into ``max``, a user's state not copied, a check
skipped, a tolerance loosened 10x), written as an operator on the syntax tree: ``compare`` (``<`` for
``<=``), ``drop-factor`` (``loss / k`` read as ``loss``), ``swap-args``, ``negate``, ``constant``,
``delete`` and, for any other hand-written change, ``replace``. The node it changes is found by its
code, not by a file or a line: the pattern is compared as a syntax tree with every node of every module
under ``accumlib/`` and ``accumlib_course/``, so a refactor that keeps behaviour (a rename elsewhere, a
module moved, a line re-wrapped) keeps every mutant. A pattern must match exactly one node (``within``
narrows it to a def or class); the operator's result is written over that node's source, the rest of
the file byte for byte.

This script applies one mutant at a time to a private copy of the working tree and runs, first, the
tests named as its ``killers`` (those that failed under it in its last recorded run), then, if they
pass, the tests that cover its module. It counts the mutant *killed* when either fails. A mutant the
tests pass is a *survivor*: either a blind spot (write a behavioural test) or an equivalent change
(argue it in the mutant's ``equivalent`` field; it then leaves the denominator). The score per group is
killed / (total - equivalent).

    .venv/bin/python tools/mutate.py                 # every group (make mutation)
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
import ast
import functools
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = Path(__file__).resolve().parent / "mutants"
RECORD, PAGE = CATALOGUE.parent / "mutation.json", CATALOGUE.parent / "mutation.md"
# pytest without the notebook and doctest collection of pyproject's addopts: each group names its
# own test files; a group that needs doctests or nbval says so in its PYTEST_ARGS.
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--no-header"]

# ---- where a mutant applies: a node found by its content ---------------------------------------------------
SEARCHED = ("accumlib", "accumlib_course")  # every .py file under these, wherever a module moves to
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class Broken(ValueError):
    """A catalogue entry that cannot be applied: its pattern matches no node, or several."""


@dataclass(frozen=True)
class Mutant:
    """One mistake: the operator ``op`` applied to the one node of the library whose code is ``pattern``.

    ``pattern`` is an expression or one or more statements, compared as syntax trees (formatting,
    comments and the file it lies in do not matter); it must match exactly one node under ``SEARCHED``,
    or one inside a def or class named ``within`` (``"f"`` or ``"Class.f"``), or say which of its matches
    (``at``, in source order, all in one module). ``node``, when given, is the part of the pattern the
    operator changes (then ``at`` counts its occurrences there instead); else the whole pattern.
    ``arg`` is the operator's argument (see ``OPS``). ``killers`` are the tests that must fail under
    the mutant (the ones that did in its last recorded run); they run first.
    """

    name: str
    op: str
    pattern: str
    arg: str = ""
    node: str = ""
    at: int | None = None
    within: str = ""
    equivalent: str = ""  # why the change cannot alter behaviour; such a mutant leaves the score
    killers: tuple[str, ...] = ()
    tests: tuple[str, ...] = ()  # overrides the group's TESTS


def _key(node, memo: dict) -> int:
    """A structural hash of a node: its type and fields, not its position, nor Load/Store."""
    if isinstance(node, ast.AST):
        k = memo.get(id(node))
        if k is None:
            k = hash(
                (type(node).__name__,)
                + tuple(_key(v, memo) for f, v in ast.iter_fields(node) if f not in ("ctx", "type_comment"))
            )
            memo[id(node)] = k
        return k
    if isinstance(node, list):
        return hash(tuple(_key(v, memo) for v in node))
    return hash((type(node).__name__, repr(node)))


def _same(a, b) -> bool:
    memo: dict = {}
    return _key(a, memo) == _key(b, memo)


def _children(node):
    """(field, index or None, child) of a node's AST children, in source order."""
    for f, v in ast.iter_fields(node):
        if isinstance(v, list):
            yield from ((f, i, c) for i, c in enumerate(v) if isinstance(c, ast.AST))
        elif isinstance(v, ast.AST):
            yield f, None, v


def _parse_pattern(src: str) -> ast.AST | list[ast.stmt]:
    """An expression if ``src`` is one, else its statements."""
    src = textwrap.dedent(src).strip()
    try:
        return ast.parse(src, mode="eval").body
    except SyntaxError:
        return ast.parse(src).body


class Library:
    """The parsed modules under ``SEARCHED`` (relative path -> text and tree), indexed by node content."""

    def __init__(self, root: Path = ROOT):
        self.root = root
        self.texts, self.trees = {}, {}
        self.index: dict[int, list] = {}  # key -> [(file, path from the module, node)]
        for top in SEARCHED:
            for p in sorted((root / top).rglob("*.py")):
                rel = p.relative_to(root).as_posix()
                self.texts[rel] = p.read_text()
                self.trees[rel] = ast.parse(self.texts[rel], rel)
                self._walk(rel, self.trees[rel], (), (), {})

    def _walk(self, rel, node, path, scopes, memo):
        self.index.setdefault(_key(node, memo), []).append((rel, path, scopes))
        if isinstance(node, SCOPES):
            scopes = (*scopes, node.name)
        for f, i, c in _children(node):
            self._walk(rel, c, (*path, (f, i)), scopes, memo)

    def find(self, pattern: str, within: str = "") -> list[tuple[str, tuple]]:
        """Every (file, path) whose node (or run of statements) is ``pattern``, inside ``within`` if given."""
        pat = _parse_pattern(pattern)
        if isinstance(pat, list) and len(pat) == 1:
            pat = pat[0]
        if isinstance(pat, list):  # a run of statements: where its first one lies, followed by the rest
            hits = []
            for rel, path, scopes in self.index.get(_key(pat[0], {}), []):
                f, i = path[-1]
                if i is not None and _same(
                    getattr(_resolve(self.trees[rel], path[:-1]), f)[i : i + len(pat)], pat
                ):
                    hits.append((rel, (*path[:-1], (f, (i, i + len(pat)))), scopes))
        else:
            hits = self.index.get(_key(pat, {}), [])
        if within:
            want = tuple(within.split("."))
            hits = [h for h in hits if any(h[2][i : i + len(want)] == want for i in range(len(h[2])))]
        return [(rel, path) for rel, path, _ in hits if _same(_resolve(self.trees[rel], path), pat)]


def _resolve(tree, path):
    node = tree
    for f, i in path:
        v = getattr(node, f)
        node = v if i is None else v[i] if isinstance(i, int) else v[i[0] : i[1]]
    return node


def _occurrences(anchor, pat) -> list[tuple]:
    """Paths (relative to ``anchor``) of the nodes inside it that are ``pat``, in source order."""
    memo: dict = {}
    want = _key(pat, memo)
    out = []

    def walk(node, path):
        if _key(node, memo) == want:
            out.append(path)
        for f, i, c in _children(node):
            walk(c, (*path, (f, i)))

    for i, s in enumerate(anchor) if isinstance(anchor, list) else [(None, anchor)]:
        walk(s, () if i is None else ((None, i),))
    return out


# ---- the operators --------------------------------------------------------------------------------------
CMP = {
    "==": ast.Eq, "!=": ast.NotEq, "<": ast.Lt, "<=": ast.LtE, ">": ast.Gt, ">=": ast.GtE,
    "is": ast.Is, "is not": ast.IsNot, "in": ast.In, "not in": ast.NotIn,
}  # fmt: skip
BIN = {
    "+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.Div, "//": ast.FloorDiv, "%": ast.Mod,
    "**": ast.Pow, "@": ast.MatMult, "|": ast.BitOr, "&": ast.BitAnd, "^": ast.BitXor,
    "<<": ast.LShift, ">>": ast.RShift,
}  # fmt: skip
BOOL = {"and": ast.And, "or": ast.Or}


def _op_compare(node, arg):
    """``a < b`` -> ``a <= b``: arg is the new comparison (``<=``, ``not in``; several: comma-separated)."""
    ops = [CMP[o.strip()]() for o in arg.split(",")]
    _expect(node, ast.Compare, len(ops) == len(node.ops), "a comparison with as many operators as arg")
    return ast.Compare(node.left, ops, node.comparators)


def _op_operator(node, arg):
    """``a * b`` -> ``a / b``, ``x and y`` -> ``x or y``, ``n += 1`` -> ``n -= 1``: arg is the operator."""
    if isinstance(node, ast.BoolOp):
        return ast.BoolOp(BOOL[arg](), node.values)
    _expect(node, (ast.BinOp, ast.AugAssign), True, "a binary operation, boolean or augmented assignment")
    if isinstance(node, ast.AugAssign):
        return ast.AugAssign(node.target, BIN[arg](), node.value)
    return ast.BinOp(node.left, BIN[arg](), node.right)


def _op_drop(node, arg):
    """``loss / k`` -> ``loss``, ``a or b or c`` -> ``a or c``: arg is the operand dropped (else the last)."""
    _expect(node, (ast.BinOp, ast.BoolOp), True, "a binary or boolean operation")
    operands = [node.left, node.right] if isinstance(node, ast.BinOp) else list(node.values)
    drop = next((i for i, v in enumerate(operands) if arg and _same(v, _parse_pattern(arg))), None)
    if arg and drop is None:
        raise Broken(f"no operand {arg!r} in {ast.unparse(node)!r}")
    rest = operands[: len(operands) - 1] if drop is None else operands[:drop] + operands[drop + 1 :]
    return rest[0] if len(rest) == 1 else ast.BoolOp(node.op, rest)


def _op_swap_args(node, arg):
    """``f(a, b)`` -> ``f(b, a)``, ``a - b`` -> ``b - a``: arg is the two positions swapped (else 0,1)."""
    if isinstance(node, ast.BinOp):
        return ast.BinOp(node.right, node.op, node.left)
    i, j = (int(x) for x in (arg or "0,1").split(","))
    _expect(node, ast.Call, max(i, j) < len(node.args), f"a call with positional arguments {i} and {j}")
    args = list(node.args)
    args[i], args[j] = args[j], args[i]
    return ast.Call(node.func, args, node.keywords)


def _op_negate(node, arg):
    """``x`` -> ``not x``, ``not x`` -> ``x``, ``-x`` -> ``x``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        return node.operand
    return ast.UnaryOp(ast.Not(), node)


def _op_constant(node, arg):
    """``1e-6`` -> ``1e-3``, ``True`` -> ``False``: arg is the new literal."""
    _expect(node, ast.Constant, True, "a constant")
    return ast.Constant(ast.literal_eval(arg))


def _op_delete(node, arg):
    """One or more statements left out (``pass`` where a block would be empty)."""
    return []


def _op_replace(node, arg):
    """Any hand-written change: arg is the new code of the node (an expression, or statements)."""
    new = _parse_pattern(arg)
    if isinstance(node, (ast.stmt, list)) and not isinstance(new, list):
        new = [ast.Expr(new)]
    return new


def _expect(node, kinds, ok, what):
    if not isinstance(node, kinds) or not ok:
        raise Broken(f"the operator wants {what}, found {ast.unparse(node)!r}")


OPS = {
    "compare": _op_compare,
    "operator": _op_operator,
    "drop-factor": _op_drop,
    "drop-term": _op_drop,
    "drop-clause": _op_drop,
    "swap-args": _op_swap_args,
    "negate": _op_negate,
    "constant": _op_constant,
    "delete": _op_delete,
    "replace": _op_replace,
}


def locate(m: Mutant, lib: Library) -> tuple[str, tuple]:
    """The file and the path (from its module) of the one node ``m`` changes; Broken unless exactly one."""
    hits = lib.find(m.pattern, m.within)
    files = sorted({rel for rel, _ in hits})
    where = (f" inside {m.within}" if m.within else "") + (f" (in {', '.join(files)})" if hits else "")
    if (
        m.at is not None and not m.node
    ):  # the at-th of the pattern's matches, all in one module: file order is no order
        if len(files) != 1 or not m.at < len(hits):
            raise Broken(f"mutant {m.name!r}: at={m.at} of {len(hits)} matches{where} (one module only)")
        hits = hits[m.at : m.at + 1]
    if len(hits) != 1:
        raise Broken(
            f"mutant {m.name!r}: its pattern matches {len(hits)} nodes{where}, not one; "
            "widen the pattern (and name the part changed with node=), or give within= or at="
        )
    rel, path = hits[0]
    if not m.node:
        return rel, path
    anchor = _resolve(lib.trees[rel], path)
    pat = _parse_pattern(m.node)
    occ = _occurrences(anchor, pat[0] if isinstance(pat, list) and len(pat) == 1 else pat)
    at = m.at or 0
    if not 0 <= at < len(occ):
        raise Broken(f"mutant {m.name!r}: node {m.node!r} occurs {len(occ)} times in its pattern (at={m.at})")
    sub = occ[at]
    if sub and sub[0][0] is None:  # the k-th statement of a run of them
        f, (i, _) = path[-1]
        return rel, (*path[:-1], (f, i + sub[0][1]), *sub[1:])
    return rel, (*path, *sub)


def apply(m: Mutant, lib: Library) -> tuple[str, str]:
    """(file, its mutated text): the operator's new node written over the old one's source, the rest of
    the file byte for byte; the result's syntax tree is checked to be the mutated one."""
    if m.op not in OPS:
        raise Broken(f"mutant {m.name!r}: op must be one of {', '.join(OPS)} (got {m.op!r})")
    rel, path = locate(m, lib)
    text = lib.texts[rel]
    tree = ast.parse(text)
    old = _resolve(tree, path)
    try:
        new = OPS[m.op](old, m.arg)
    except (Broken, KeyError, ValueError, SyntaxError) as e:
        raise Broken(f"mutant {m.name!r}: {m.op}: {e}") from None
    if isinstance(old, ast.expr) and isinstance(new, list):  # statements for an expression: its statement's
        if path[-1] != ("value", None) or not isinstance(_resolve(tree, path[:-1]), ast.Expr):
            raise Broken(f"mutant {m.name!r}: {m.op} gives statements for an expression inside one")
        path = path[:-1]
        old = _resolve(tree, path)
    if _same(old if isinstance(new, list) == isinstance(old, list) else [old], new):
        raise Broken(f"mutant {m.name!r}: its operator changes nothing")
    olds = old if isinstance(old, list) else [old]
    first, last = olds[0], olds[-1]
    spans = [(s.lineno, s.end_lineno, s.end_col_offset) for s in tree.body]
    parent, (f, i) = _resolve(tree, path[:-1]), path[-1]
    if i is None:
        setattr(parent, f, new)
    else:
        body = getattr(parent, f)
        lo, hi = (i, i + 1) if isinstance(i, int) else i
        body[lo:hi] = new if isinstance(new, list) else [new]
        if not body and f in ("body", "finalbody"):
            body.append(ast.Pass())
    for mutated in _renderings(text, first, last, new):
        try:
            if _written(ast.parse(mutated), tree, path[0], spans, mutated.count("\n") - text.count("\n")):
                return rel, mutated
        except SyntaxError:
            pass
    return rel, ast.unparse(tree) + "\n"  # the whole module rewritten: comments lost, tree exact


def _written(got: ast.Module, want: ast.Module, top, spans, shift: int) -> bool:
    """Whether the parsed text ``got`` is the mutated tree ``want``: the top-level statement changed is
    compared whole; the others, whose text is the same bytes, by where they lie (``shift`` lines down
    after the change)."""
    if not isinstance(top[1], int) or len(got.body) != len(want.body):
        return _same(got, want)
    t = top[1]
    after = [(a + shift, b + shift, c) for a, b, c in spans[t + 1 :]]
    lie = [(s.lineno, s.end_lineno, s.end_col_offset) for s in got.body]
    return lie[:t] == spans[:t] and lie[t + 1 :] == after and _same(got.body[t], want.body[t])


def _renderings(text: str, first, last, new):
    """The file with the old node's source replaced by the new node's, in the ways that may parse right."""
    b = text.encode()
    starts = [0]
    for line in b.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    line0 = first.decorator_list[0].lineno if getattr(first, "decorator_list", None) else first.lineno
    lo, hi = starts[line0 - 1] + first.col_offset, starts[last.end_lineno - 1] + last.end_col_offset
    if isinstance(new, ast.AST) and not isinstance(new, ast.stmt):
        code = ast.unparse(new)
        yield from (_splice(b, lo, hi, c) for c in (code, f"({code})"))
        return
    indent = b[starts[line0 - 1] : lo].decode()
    new = new if isinstance(new, list) else [new]
    if new:
        code = "\n".join(ast.unparse(s) for s in new).replace(
            "\n", "\n" + (indent if not indent.strip() else "")
        )
        yield _splice(b, lo, hi, code)
    elif not indent.strip() and b[hi : starts[last.end_lineno]].strip()[:1] in (b"", b"#"):  # whole lines
        yield _splice(b, starts[line0 - 1], starts[last.end_lineno], "")
    yield _splice(b, lo, hi, "pass")


def _splice(b: bytes, lo: int, hi: int, code: str) -> str:
    return (b[:lo] + code.encode() + b[hi:]).decode()


# ---- the catalogue ---------------------------------------------------------------------------------------
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


def picked(mutants, only=()) -> list[Mutant]:
    """The mutants whose name contains one of ``only`` (all when it is empty)."""
    return [m for m in mutants if not only or any(s in m.name for s in only)]


@functools.cache
def _test_module(path: Path) -> list[ast.stmt]:
    return ast.parse(path.read_text()).body


def missing_test(test: str, root: Path = ROOT) -> str:
    """Why a test id (``path``, ``path::name`` or ``path::Class::name``) names nothing, or ''."""
    path, *names = test.split("::")
    if not (root / path).exists():
        return f"{path} does not exist"
    if not names or not path.endswith(".py"):
        return ""
    scope = _test_module(root / path)
    for name in names:
        found = [n for n in scope if isinstance(n, (*SCOPES,)) and n.name == name.split("[")[0]]
        if not found:
            return f"{path} defines no {name.split('[')[0]}"
        scope = found[0].body
    return ""


def problems(group: str, only=(), lib: Library | None = None, need_killers: bool = True) -> list[str]:
    """What keeps a group's catalogue from running: a test or killer that does not exist, a pattern that
    matches no node or several, an operator that does not fit its node, a mutant that changes nothing
    or does not compile, a mutant not equivalent that names no killer."""
    mod, lib = load(group), lib or Library()
    out = [f"test path {t}: {why}" for t in mod.TESTS if (why := missing_test(t.split("::")[0]))]
    for m in picked(mod.MUTANTS, only):
        out += [
            f"mutant {m.name!r}: test {t}: {why}" for t in m.tests + m.killers if (why := missing_test(t))
        ]
        if need_killers and not m.killers and not m.equivalent:
            out.append(f"mutant {m.name!r}: names no killers (the tests that must fail under it)")
        try:
            rel, mutated = apply(m, lib)
            compile(mutated, rel, "exec")
        except (Broken, SyntaxError) as e:
            out.append(str(e) if str(e).startswith("mutant") else f"mutant {m.name!r}: {e}")
            continue
    return out


# ---- running ---------------------------------------------------------------------------------------------
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
        "--only",
        action="append",
        default=[],
        help="run only mutants whose name contains this string (repeatable; results not recorded)",
    )
    ap.add_argument("--list", action="store_true", help="check and print the catalogue, run nothing")
    a = ap.parse_args(argv)
    unknown = set(a.groups) - set(groups())
    if unknown:
        ap.error(f"groups must be among {', '.join(groups())} (got {', '.join(sorted(unknown))})")
    chosen = a.groups or groups()
    if a.list:
        lib = Library()
        broken = [f"{g}: {p}" for g in chosen for p in problems(g, a.only, lib)]
        names = [m.name for g in groups() for m in load(g).MUTANTS]
        broken += [f"mutant {n!r} is named twice" for n in sorted({n for n in names if names.count(n) > 1})]
        for g in chosen:
            for m in picked(load(g).MUTANTS, a.only):
                hits = lib.find(m.pattern, m.within)
                # one match, or several in one module that the pattern's at= picks among
                one = len(hits) == 1 or (m.at is not None and len({h[0] for h in hits}) == 1)
                where = hits[0][0] if one else f"BROKEN ({len(hits)} matches)"
                print(
                    f"{g:12} {where}: {m.op}: {m.name}"
                    + (f"  [equivalent: {m.equivalent}]" if m.equivalent else "")
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


def run_group(g: str, tree: Path, only=()) -> dict | None:
    mod = load(g)
    broken = problems(g, only, lib := Library(tree), need_killers=False)  # a run finds them
    if broken:
        print("".join(f"\n{g}: broken: {p}" for p in broken) + "\nfix the catalogue first", file=sys.stderr)
        return None
    extra = list(getattr(mod, "PYTEST_ARGS", ()))
    status, base, tail = run_tests(tree, mod.TESTS, extra, timeout=1800)
    if status != "survived":
        print(f"{g}: the unmutated tests do not pass ({status}: {tail}); fix them first", file=sys.stderr)
        return None
    print(f"{g}: baseline {base:.0f} s over {' '.join(mod.TESTS)}", flush=True)
    rows = []
    for m in picked(mod.MUTANTS, only):
        rel, mutated = apply(m, lib)
        path = tree / rel
        path.write_text(mutated)
        try:
            status, secs, tail = (
                run_tests(tree, m.killers, extra, timeout=3 * base + 60) if m.killers else ("", 0, "")
            )
            by_killers = status in ("killed", "timeout")
            if not by_killers:  # its killers passed (or it names none): the tests of its module
                status, more, tail = run_tests(tree, m.tests or mod.TESTS, extra, timeout=3 * base + 60)
                secs += more
        finally:
            path.write_text(lib.texts[rel])
        if status == "survived" and m.equivalent:
            status = "equivalent"
        said = "" if not m.killers else "by its killers" if by_killers else "its killers passed"
        print(
            f"  {status:10} {secs:5.0f} s  {m.name}"
            + (f"\n             {tail}" if status in ("killed", "timeout") else "")
            + (f"\n             {said}" if said and status != "equivalent" else ""),
            flush=True,
        )
        rows.append(
            {
                "name": m.name,
                "file": rel,
                "status": status,
                "detail": tail if status == "killed" else "",
                "killers": "failed" if by_killers else "passed" if m.killers else "none named",
                "equivalent": m.equivalent,
            }
        )
    c = tally(rows)
    print(
        f"{g}: killed {c['killed']} (+{c['timeout']} by timeout) of {c['judged']} non-equivalent "
        f"({score(c)}); {c['equivalent']} equivalent; "
        f"{sum(r['killers'] == 'failed' for r in rows)} by their named killers",
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
        "Written by `tools/mutate.py` (`make mutation`) from `tools/mutation.json` (each group's latest",
        "whole run). A mutant is an operator on the syntax tree (a changed comparison, a dropped factor, a",
        "swapped argument, a replaced expression) applied to the one node of `accumlib/` or",
        "`accumlib_course/` whose code its catalogue (`tools/mutants/`) names, wherever that code lies. It",
        "is killed when the tests it names as its killers, or else the tests that cover its module, fail;",
        "*equivalent* mutants (argued in their catalogue) leave the score, which is killed /",
        "non-equivalent. The file shown is where the node lay in the group's latest whole run.",
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
    lines += ["", "| group | tests run per mutant (when its killers pass) | baseline |", "|---|---|---|"]
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
