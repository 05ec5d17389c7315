"""Mutants of the in-place engine behind ``accumlib run`` and ``accumlib.watch`` (accumlib/_verify/inplace.py,
watch.py) and the run-level rules it shares with verify (diagnose_run.py): the mistakes an engine that
judges a run from its own backwards could make."""

from mutate import Mutant

TESTS = [
    "tests/test_watch.py",
    "tests/test_watch_gallery.py",
    "tests/test_gallery.py",
    "tests/test_watch_passes.py",
    "tests/test_watch_trainer.py",
    "tests/test_watch_optimizers.py",
]
PYTEST_ARGS: list[str] = []


MUTANTS = [
    # ---- the oracle from the run's own backwards (inplace.py) ------------------------------------------
    Mutant(
        "a mean loss call's weight read as a sum's (its item count left out)",
        "replace",
        "(call.items if call.m is None else call.m) / u.reshape(())",
        "1.0",
        node="call.items",
        killers=("tests/test_watch.py::test_mean_of_means_over_ragged_token_counts_is_named",),
    ),
    Mutant(
        "each deposit summed as it came, not scaled back to its items' gradient",
        "replace",
        "buf.addcmul_(g, self.ratio)",
        "buf.add_(g)",
        killers=("tests/test_watch.py::test_the_correct_ragged_loop_is_ok_against_the_tests_own_truth",),
    ),
    Mutant(
        "a window's first deposit summed onto the last window's O, not written over it",
        "replace",
        "set(self.sums)",
        "set()",
        killers=("tests/test_watch.py::test_the_correct_ragged_loop_is_ok_against_the_tests_own_truth",),
    ),
    Mutant(
        "a parameter no backward of the window reached read with the last window's O",
        "delete",
        "buf.zero_()",
        killers=(
            "tests/test_watch.py::test_a_parameter_no_backward_of_a_window_reaches_holds_no_sum_from_the_last",
        ),
    ),
    Mutant(
        "what .grad held as a window opened never read (a forgotten zero_grad passes)",
        "replace",
        "bool(torch.cat(mine).any()) if mine else False",
        "False",
        killers=("tests/test_watch.py::test_each_broken_loop_is_named_with_its_code",),
    ),
    Mutant(
        "requires_grad changed inside a window not seen",
        "replace",
        "len({b.frozen & {id(p) for p in _params(opt)} for b in w}) > 1",
        "False",
        killers=("tests/test_gallery.py::test_every_door_gives_a_gallery_loop_one_verdict",),
    ),
    Mutant(
        "a job's ranks taken as stepping alike without comparing their checksums",
        "replace",
        "any((not torch.equal(e[3:], every[0][3:]) for e in every))",
        "False",
        killers=("tests/test_run_ranks.py::test_a_ddp_job_is_judged_once_for_the_whole_job",),
        tests=("tests/test_run_ranks.py",),
    ),
    # ---- the step rules the engine's exact weights feed (diagnose.py) ---------------------------------
    Mutant(
        "weights of one factor taken as the gradient's without meeting the measured factor",
        "replace",
        "n.factor_resid <= tol and near(n.factor, w[0], tol)",
        "True",
        killers=(
            "tests/test_watch.py::test_rows_of_grad_masked_through_data_are_unexplained_not_a_misscale_by_one",
        ),
    ),
    # ---- the run-level rules (diagnose_run.py) ---------------------------------------------------------
    Mutant(
        "a clip of the loop's own judged by the micro-batches' weights alone, not the rescale it made",
        "replace",
        "(after, [0.0] * len(fits))",
        "(1.0, [0.0] * len(fits))",
        killers=("tests/test_gallery.py::test_every_door_gives_a_gallery_loop_one_verdict",),
    ),
    # ---- passes over the data (watch.py) ---------------------------------------------------------------
    Mutant(
        "a pass read as ended one micro-batch late",
        "compare",
        "it._num_yielded >= size",
        ">",
        killers=(
            "tests/test_watch_passes.py::test_three_epochs_with_a_stepped_tail_each_are_ok_against_the_tests_own_truth",
        ),
    ),
    Mutant(
        "the run's length taken as the last pass's, even where a DataLoader said where it ended",
        "drop-clause",
        "not stopped and (not eng.window) and (not sub[-1].epoch_end)",
        "not sub[-1].epoch_end",
        killers=(
            "tests/test_watch_passes.py::test_three_epochs_with_a_stepped_tail_each_are_ok_against_the_tests_own_truth",
        ),
    ),
    Mutant(
        "any pass left unfinished counted as a dropped tail (a loop sampling fresh iterators)",
        "replace",
        "0 < n < k",
        "0 < n",
        killers=(
            "tests/test_watch_passes.py::test_windows_drawn_from_a_fresh_shuffled_iterator_each_are_sampling_not_a_dropped_tail",
        ),
    ),
    Mutant(
        "a pass that closed no step (an evaluation) counted like a training pass",
        "drop-clause",
        "before is not None and before[1] and before[2]",
        "before[2]",
        killers=(
            "tests/test_watch_passes.py::test_an_evaluation_stopped_early_between_epochs_is_no_training_pass",
        ),
    ),
    Mutant(
        "items never drawn counted as none (the total reads complete)",
        "drop-clause",
        "stopped or undrawn",
        "undrawn",
        killers=(
            "tests/test_watch_passes.py::test_epochs_rounded_down_to_whole_windows_drop_each_passes_tail",
        ),
    ),
    Mutant(
        "accum_steps read from the run as the shorter window length on a tie",
        "replace",
        "(lengths[m], m)",
        "-m",
        node="m",
        at=1,
        killers=("tests/test_watch_passes.py::test_accum_steps_read_from_a_tied_run_is_the_longer_window",),
    ),
]
