"""Mutants of the in-place engine behind ``accumlib run`` and ``accumlib.watch`` (accumlib/_verify/inplace.py,
watch.py) and the run-level rules it shares with verify (diagnose_run.py): the mistakes an engine that
judges a run from its own backwards could make."""

from mutate import Mutant

TESTS = [
    "tests/test_watch.py",
    "tests/test_watch_gallery.py",
    "tests/test_watch_passes.py",
    "tests/test_watch_trainer.py",
    "tests/test_watch_optimizers.py",
]
PYTEST_ARGS: list[str] = []

IP, W, DR = "accumlib/_verify/inplace.py", "accumlib/_verify/watch.py", "accumlib/_verify/diagnose_run.py"

MUTANTS = [
    # ---- the oracle from the run's own backwards (inplace.py) ------------------------------------------
    Mutant(
        "a mean loss call's weight read as a sum's (its item count left out)",
        IP,
        "r = call.items / u.reshape(())",
        "r = 1.0 / u.reshape(())",
    ),
    Mutant(
        "each deposit summed as it came, not scaled back to its items' gradient",
        IP,
        "buf.addcmul_(g, self.ratio)",
        "buf.add_(g)",
    ),
    Mutant(
        "a window's first deposit summed onto the last window's O, not written over it",
        IP,
        "self.stale = set(self.sums)",
        "self.stale = set()",
    ),
    Mutant(
        "a parameter no backward of the window reached read with the last window's O",
        IP,
        "            buf.zero_()\n            self.stale.discard(id(p))",
        "            self.stale.discard(id(p))",
    ),
    Mutant(
        "what .grad held as a window opened never read (a forgotten zero_grad passes)",
        IP,
        "bool(torch.cat(mine).any()) if mine else False",
        "False",
    ),
    Mutant(
        "requires_grad changed inside a window not seen",
        IP,
        "numbers.frozen_changed = len({b.frozen & {id(p) for p in _params(opt)} for b in w}) > 1",
        "numbers.frozen_changed = False",
    ),
    Mutant(
        "a job's ranks taken as stepping alike without comparing their checksums",
        "accumlib/_verify/inplace_job.py",
        "    if any(not torch.equal(e[3:], every[0][3:]) for e in every):",
        "    if False:",
        tests=("tests/test_run_ranks.py",),
    ),
    # ---- the step rules the engine's exact weights feed (diagnose.py) ---------------------------------
    Mutant(
        "weights of one factor taken as the gradient's without meeting the measured factor",
        "accumlib/_verify/diagnose.py",
        "    return n.factor_resid <= tol and (near(n.factor, w[0], tol) or near(n.factor, w[0] * after, tol))",
        "    return True",
    ),
    # ---- the run-level rules (diagnose_run.py) ---------------------------------------------------------
    Mutant(
        "a clip of the loop's own judged by the micro-batches' weights alone, not the rescale it made",
        DR,
        'return v.factor * s.rescaled if v.cause == "rescaled" else v.factor',
        "return v.factor",
    ),
    # ---- passes over the data (watch.py) ---------------------------------------------------------------
    Mutant(
        "a pass read as ended one micro-batch late",
        W,
        "if size and it._num_yielded >= size:",
        "if size and it._num_yielded > size:",
    ),
    Mutant(
        "the run's length taken as the last pass's, even where a DataLoader said where it ended",
        W,
        "if not stopped and not eng.window and not sub[-1].epoch_end:",
        "if not stopped and not eng.window:",
    ),
    Mutant(
        "any pass left unfinished counted as a dropped tail (a loop sampling fresh iterators)",
        W,
        "tails = [(n, size) for n, size in self.left if 0 < n < k]",
        "tails = [(n, size) for n, size in self.left if 0 < n]",
    ),
    Mutant(
        "a pass that closed no step (an evaluation) counted like a training pass",
        W,
        "if before is not None and before[1] and before[2]:",
        "if before is not None and before[1]:",
    ),
    Mutant(
        "items never drawn counted as none (the total reads complete)",
        W,
        "total = None if stopped or undrawn else",
        "total = None if stopped else",
    ),
    Mutant(
        "accum_steps read from the run as the shorter window length on a tie",
        W,
        "max(lengths, key=lambda m: (lengths[m], m))",
        "max(lengths, key=lambda m: (lengths[m], -m))",
    ),
]
