"""Mutants of accumlib/_verify/ (accumlib.verify: record, measure, oracle, diagnose and diagnose_run,
coverage, report, the copy) and accumlib/tolerances.py: the mistakes a verifier of gradient accumulation
could make. Its argument checks are accumlib/checks.py's (group checks)."""

from mutate import Mutant

TESTS = [
    "tests/test_verify.py",
    "tests/test_verify_boundaries.py",
    "tests/test_verify_blind_spots.py",
    "tests/test_verify_data.py",
    "tests/test_verify_samplers.py",
    "tests/test_verify_clip_rules.py",
    "tests/test_verify_frozen.py",
    "tests/test_verify_hints.py",
    "tests/test_verify_loop_shapes.py",
    "tests/test_verify_ragged_tail.py",
    "tests/test_verify_untouched.py",
    "tests/test_verify_large_models.py",
    "tests/test_verify_report_text.py",
    "tests/test_verify_cli.py",
    "tests/test_verify_in_place.py",
    "tests/test_gallery.py",
    "accumlib/_verify/api.py",
    "accumlib/_verify/copying.py",
    "accumlib/_verify/report.py",
]
# the modules' own examples are part of the suite; left out: a subprocess memory measurement (30 s), the
# command line run as real processes (90 s), and the two gallery loops that import transformers and Lightning
PYTEST_ARGS = [
    "--doctest-modules",
    "--deselect",
    "tests/test_verify_frozen.py::test_a_frozen_base_costs_verify_its_copy_and_no_buffers",
    "-k",
    "not real_command_line and not bert-train-one-epoch and not lightning",
]
# 2 gloo ranks, one launch for ~10 loops: only for the multi-rank code
RANKS = ("tests/test_verify_ranks.py",)
# 2 gloo ranks, two loops: ranks holding different parameters
RANKS_PARAMS = ("tests/test_verify_ranks_params.py",)

MUTANTS = [
    # ---- judged in place: the engine's figures, and when the recompute oracle takes over ------------------
    Mutant(
        "the one-window check passes any gradient",
        "replace",
        "gap <= ROUNDING_FLOOR",
        "math.inf",
        node="ROUNDING_FLOOR",
        killers=(
            "tests/test_verify_in_place.py::test_a_loop_whose_loss_is_not_item_losses_mean_is_never_judged_by_its_own_loss",
        ),
    ),
    Mutant(
        "the one-window check ignores the item counts",
        "drop-clause",
        "replayed != items or not gap <= ROUNDING_FLOOR",
        "replayed != items",
        killers=(
            "tests/test_verify_hints.py::test_a_mean_over_outputs_where_the_loop_sums_is_named_as_a_possible_item_losses_mismatch",
        ),
    ),
    Mutant(
        "a step the engine could not judge taken in place",
        "replace",
        "if limits:\n    raise Fallback(f\"step {t}: {', '.join(limits)}\")",
        "False",
        node="limits",
        killers=(
            "tests/test_verify_in_place.py::test_a_step_the_engine_cannot_judge_mid_window_runs_the_loop_again_from_the_same_random_state",
        ),
    ),
    Mutant(
        "a factor applied after the last backward left out of the weights",
        "replace",
        "(after, [0.0] * len(fits))",
        "(1.0, [0.0] * len(fits))",
        killers=(
            "tests/test_verify_boundaries.py::test_grad_divided_by_k_after_every_backward_is_zero_grad_inside_window",
        ),
    ),
    Mutant(
        "the recompute oracle never takes a run over",
        "replace",
        "not why",
        "True",
        killers=(
            "tests/test_verify_in_place.py::test_a_loss_term_that_appears_late_hands_the_rest_of_the_run_to_the_recompute_oracle",
        ),
    ),
    # ---- diagnose: naming a step from its numbers -------------------------------------------------------
    Mutant(
        "a skipped GradScaler step judged like any other",
        "replace",
        "n.skipped",
        "False",
        killers=("tests/test_verify.py::test_window_skipped_by_gradscaler_is_not_merged_into_the_next",),
    ),
    Mutant(
        "a step without micro-batches after untracked forwards called early-step",
        "replace",
        "if n.untracked:\n"
        "    out.codes.append('untracked-data')\n"
        "    out.detail = f'{n.untracked} forward(s) since the previous step ran on data verify did "
        "not hand out'\n"
        "else:\n"
        "    out.codes.append('early-step')\n"
        "    out.detail = 'stepped without a single micro-batch since the previous step'",
        "False",
        node="n.untracked",
        killers=("tests/test_verify_data.py::test_data_verify_never_handed_out_is_said_not_misnamed",),
    ),
    Mutant(
        "a non-finite gradient not reported",
        "replace",
        "not n.finite",
        "False",
        killers=("tests/test_verify.py::test_non_finite_gradient_is_a_finding",),
    ),
    Mutant(
        "a window without items not reported",
        "replace",
        "n.items == 0",
        "False",
        killers=("tests/test_verify.py::test_window_without_items_is_a_finding",),
    ),
    Mutant(
        "learning rates compared only between windows, not inside one",
        "drop-clause",
        "n.lr_changed or len(set(n.lrs)) > 1",
        "len(set(n.lrs)) > 1",
        killers=("tests/test_verify_boundaries.py::test_learning_rate_set_by_hand_per_micro_batch",),
    ),
    Mutant(
        "freezing inside a window ignored",
        "replace",
        "n.frozen_changed",
        "False",
        killers=("tests/test_verify_frozen.py::test_unfreezing_inside_a_window_is_a_bug_of_its_own",),
    ),
    Mutant(
        "any short window that ends a pass excused, whatever its size",
        "drop-clause",
        "n.epoch_end and m == n.pass_length % k",
        "m == n.pass_length % k",
        killers=("tests/test_gallery.py::test_every_door_gives_a_gallery_loop_one_verdict",),
    ),
    Mutant(
        "a window longer than k not named (k = 4 where 2 is asked, one step per epoch pass)",
        "replace",
        "if m > k:\n    out.codes.append('late-step')",
        "False",
        node="m > k",
        killers=(
            "tests/test_verify.py::test_k_typed_larger_than_asked_is_late_step_and_the_correct_loop_beside_it_is_not",
        ),
    ),
    Mutant(
        "a long window that ends a pass excused like a short tail (a tail merged into the last window)",
        "replace",
        "if m > k:\n    out.codes.append('late-step')",
        "m > k and (not n.epoch_end)",
        node="m > k",
        killers=(
            "tests/test_verify.py::test_one_step_per_epoch_is_late_step_and_only_the_codes_it_deserves",
        ),
    ),
    Mutant(
        "c = m/k on a late window named misscaled (loss / k is right for the k asked)",
        "replace",
        "m > k and near(c, m / k, tol)",
        "False",
        killers=(
            "tests/test_verify.py::test_one_step_per_epoch_is_late_step_and_only_the_codes_it_deserves",
        ),
    ),
    Mutant(
        "every factor on a late window excused, not only c = m/k",
        "drop-clause",
        "m > k and near(c, m / k, tol)",
        "near(c, m / k, tol)",
        killers=("tests/test_verify.py::test_a_late_step_still_names_what_else_is_wrong",),
    ),
    Mutant(
        "a late step taken to explain a gradient no bug explains (unexplained not said)",
        "replace",
        "('scheduler-per-micro-batch', 'frozen-inside-window', 'late-step')",
        "('scheduler-per-micro-batch', 'frozen-inside-window')",
        killers=("tests/test_verify.py::test_a_late_step_still_names_what_else_is_wrong",),
    ),
    Mutant(
        "a late step's count said as the asked k, not the micro-batches it averaged",
        "replace",
        "sorted({numbers[t].micro_batches for t in at['late-step']})",
        "[k]",
        killers=(
            "tests/test_verify.py::test_k_typed_larger_than_asked_is_late_step_and_the_correct_loop_beside_it_is_not",
        ),
    ),
    Mutant(
        "a clip one micro-batch before the window's end counted as complete",
        "replace",
        "0 < c.seen < m",
        "m - 1",
        node="m",
        killers=("tests/test_verify_blind_spots.py::test_clip_one_micro_batch_before_the_window_ends",),
    ),
    Mutant(
        "clip-before-unscale ratio loosened 10x",
        "replace",
        "seen > SCALED_CLIP_RATIO",
        "10 * SCALED_CLIP_RATIO",
        node="SCALED_CLIP_RATIO",
        killers=("tests/test_verify_blind_spots.py::test_clip_before_unscale_at_any_scale",),
    ),
    Mutant(
        "every loop judged at the autocast tolerance",
        "replace",
        "FLOAT32_RTOL if precision == 'float32' else AUTOCAST_RTOL",
        "AUTOCAST_RTOL",
        killers=("tests/test_verify_boundaries.py::test_a_misscale_of_five_hundredths_of_a_percent_fails",),
    ),
    Mutant(
        "a step judged ok at 10x the rounding tolerance",
        "replace",
        "if n.rel <= tol:\n    out.batchnorm_limit = n.batchnorm\n    return out",
        "10 * tol",
        node="tol",
        killers=("tests/test_verify_boundaries.py::test_a_misscale_of_five_hundredths_of_a_percent_fails",),
    ),
    Mutant(
        "fits accepted at the tighter of the two tolerances (min for max)",
        "replace",
        "if n.rel <= tol:\n"
        "    out.batchnorm_limit = n.batchnorm\n"
        "    return out\n"
        "fit_tol = max(FIT_RTOL, tol)",
        "min",
        node="max",
        killers=(
            "tests/test_verify_boundaries.py::test_a_fit_with_residual_below_FIT_RTOL_names_the_factor",
        ),
    ),
    Mutant(
        "a leak named only when it is most of the gradient",
        "replace",
        "n.leak_coef > COEF_RTOL",
        "0.5",
        node="COEF_RTOL",
        killers=(
            "tests/test_verify_boundaries.py::test_no_zero_grad_under_gradscaler_at_a_small_scale_is_named",
        ),
    ),
    Mutant(
        "a window's micro-batches all small but one factor called a zeroing",
        "drop-clause",
        "any(near0) and (not one_factor)",
        "not one_factor",
        killers=(
            "tests/test_verify_ragged_tail.py::test_a_mean_divided_by_its_windows_item_count_names_cause_1_over_b_on_a_ragged_tail",
        ),
    ),
    Mutant(
        "a near-zero weight anywhere taken for all zero (no zero-grad-inside-window)",
        "replace",
        "all(near0)",
        "any",
        node="all",
        killers=(
            "tests/test_verify_boundaries.py::test_grad_divided_by_k_after_every_backward_is_zero_grad_inside_window",
        ),
    ),
    Mutant(
        "tail-misscaled judged against m, not k",
        "replace",
        "v[0] * k",
        "m",
        node="k",
        killers=("tests/test_verify.py::test_reference_loops_get_their_documented_verdict",),
    ),
    Mutant(
        "means of unequal micro-batches off by one factor not named (over-division: unexplained)",
        "replace",
        "unequal and v[0] > 0",
        "False",
        killers=(
            "tests/test_verify_ragged_tail.py::test_a_mean_divided_by_its_windows_item_count_names_cause_1_over_b_on_a_ragged_tail",
        ),
    ),
    Mutant(
        "a short window at m/k per micro-batch not tail-misscaled",
        "replace",
        "m < k and all((near(x, m / k, tol) for x in w))",
        "False",
        killers=(
            "tests/test_verify_ragged_tail.py::test_a_ragged_tail_weighted_by_its_share_of_a_full_window_is_tail_misscaled",
        ),
    ),
    Mutant(
        "misscaled named despite a leak",
        "drop-clause",
        "not n.leak and all((near(x, w[0], SAME_FACTOR_RTOL) for x in w))",
        "not n.leak",
        killers=("tests/test_verify_boundaries.py::test_grad_kept_as_a_decaying_sum_is_no_zero_grad",),
    ),
    Mutant(
        "the label-shift cause offered for items that are not tokens",
        "compare",
        "0 < sequences < items",
        "<, <=",
        killers=("tests/test_verify.py::test_clipping_we_cannot_intercept_is_recognised_from_norms",),
    ),
    Mutant(
        "cause 1/m never predicted",
        "replace",
        "[('1/m', 1 / m)] if m > 1 else []",
        "[]",
        killers=("tests/test_verify_boundaries.py::test_window_mean_divided_by_m_names_cause_1_over_m",),
    ),
    Mutant(
        "cause 1/b predicted only for full windows (a short tail over k x b blamed on item_losses)",
        "replace",
        "[('1/b', m * m / (k * items))] if m < k else []",
        "[]",
        killers=(
            "tests/test_verify_ragged_tail.py::test_a_mean_divided_by_k_times_b_names_cause_1_over_b_on_a_short_tail",
        ),
    ),
    Mutant(
        "cause 1/b predicted as k/N (right on full windows only: a short tail's m/N named a reduction)",
        "replace",
        "m / items",
        "k",
        node="m",
        killers=(
            "tests/test_verify_ragged_tail.py::test_a_mean_divided_by_its_windows_item_count_names_cause_1_over_b_on_a_ragged_tail",
        ),
    ),
    Mutant(
        "cause 1/b predicted as 1/m",
        "replace",
        "m / items",
        "1 / m",
        killers=(
            "tests/test_verify_ragged_tail.py::test_a_mean_divided_by_k_times_b_names_cause_1_over_b_on_a_short_tail",
        ),
    ),
    Mutant(
        "a whole ratio of 1 taken for a reduction",
        "constant",
        "d >= 2",
        "1",
        node="2",
        killers=("tests/test_verify_boundaries.py::test_a_misscale_of_five_hundredths_of_a_percent_fails",),
    ),
    Mutant(
        "one scaled step taken as evidence of a clip",
        "constant",
        "len(scaled) < 2",
        "1",
        node="2",
        killers=("tests/test_verify_boundaries.py::test_grad_kept_as_a_decaying_sum_is_no_zero_grad",),
    ),
    Mutant(
        "a clip refuted only when every step scales up, not any",
        "replace",
        "any((v.factor is None or v.factor >= 1 for _, v in scaled))",
        "all",
        node="any",
        killers=(
            "tests/test_verify_boundaries.py::test_a_loops_own_norm_setting_that_scales_some_steps_up_is_no_clip",
        ),
    ),
    Mutant(
        "clip norms matched 10x more loosely",
        "replace",
        "near(x, c, CLIP_NORM_RTOL)",
        "10 * CLIP_NORM_RTOL",
        node="CLIP_NORM_RTOL",
        killers=(
            "tests/test_verify_boundaries.py::test_norms_two_tenths_of_a_percent_apart_are_not_one_clip",
        ),
    ),
    Mutant(
        "ok steps above the clip norm do not refute the clip",
        "drop-clause",
        "all((near(x, c, CLIP_NORM_RTOL) for x in norms)) and all((x <= c * (1 + CLIP_NORM_RTOL) for x "
        "in fine))",
        "all((x <= c * (1 + CLIP_NORM_RTOL) for x in fine))",
        killers=("tests/test_verify_boundaries.py::test_ok_steps_above_the_norm_rule_out_a_clip",),
    ),
    Mutant(
        "a constant divisor named from a single window size",
        "compare",
        "len({s.items for s, _ in scaled}) > 1",
        ">=",
        killers=("tests/test_verify_boundaries.py::test_a_misscale_of_five_hundredths_of_a_percent_fails",),
    ),
    Mutant(
        "a misscale masked by clipping judged on the norm ratio, not the error",
        "constant",
        "like_for_like(s, done)[1]",
        "0",
        node="1",
        killers=(
            "tests/test_verify_clip_rules.py::test_a_misscale_hidden_by_a_real_clip_is_named_as_hidden",
        ),
    ),
    Mutant(
        "the clipped truth ignores the +1e-6 of torch's clip",
        "drop-term",
        "lam * math.sqrt(n.tt) + 1e-06",
        "1e-06",
        killers=("tests/test_verify_boundaries.py::test_clip_of_a_tiny_gradient_is_undone_exactly",),
    ),
    Mutant(
        "a scheduler code counted as explaining the gradient",
        "replace",
        "out.window_scale or any((c not in schedule for c in out.codes))",
        "bool(out.codes)",
        killers=(
            "tests/test_verify_boundaries.py::test_a_scheduler_per_micro_batch_does_not_explain_a_wrong_gradient",
        ),
    ),
    Mutant(
        "ranks that hold different parameters not diverged",
        "replace",
        "max(n.diverged, n.params_diverged)",
        "n.diverged",
        killers=(
            "tests/test_verify_ranks_params.py::test_ranks_that_start_from_different_parameters_are_diverged_though_their_gradients_agree",
        ),
        tests=RANKS_PARAMS,
    ),
    Mutant(
        "a per-rank mean not told apart from a common factor",
        "replace",
        "n.per_rank_resid <= fit_tol",
        "False",
        killers=(
            "tests/test_verify_ranks.py::test_every_example_loop_gets_exactly_the_codes_it_is_listed_with",
        ),
        tests=RANKS,
    ),
    # ---- record: hooks on verify's copy -----------------------------------------------------------------
    Mutant(
        "a collate after the loop read the dataset takes the oldest reads as the batch",
        "replace",
        "self.dataset.pending[len(self.dataset.pending) - len(samples):]",
        "self.dataset.pending[:len(samples)]",
        killers=(
            "tests/test_verify_loop_shapes.py::test_a_length_sweep_before_a_length_grouped_sampler_is_not_a_micro_batch",
        ),
    ),
    Mutant(
        "an iterable dataset's drawn count never reset per batch",
        "delete",
        "self.dataset.pending = 0",
        killers=("tests/test_verify_boundaries.py::test_a_stream_that_ends_between_batches_ends_its_pass",),
    ),
    Mutant(
        "a merged forward matched to the newest micro-batches drawn",
        "replace",
        "for b in self.fresh:\n"
        "    taken.append(b)\n"
        "    total += self.mbs[b].rows\n"
        "    if total >= rows:\n"
        "        break",
        "reversed(self.fresh)",
        node="self.fresh",
        killers=("tests/test_verify.py::test_reference_loops_get_their_documented_verdict",),
    ),
    Mutant(
        "a merged forward matched to more rows than it holds",
        "compare",
        "total == rows",
        ">=",
        killers=(
            "tests/test_verify_loop_shapes.py::test_an_evaluation_forward_on_data_of_the_loops_own_is_not_a_micro_batch",
        ),
    ),
    Mutant(
        "a second forward of a used micro-batch counted as a new one",
        "replace",
        "[b for b in ids if b not in self.consumed]",
        "list(ids)",
        killers=(
            "tests/test_verify_clip_rules.py::test_constant_divisor_is_misscaled_at_every_step_with_its_own_c",
        ),
    ),
    Mutant(
        "a group closed at every forward, backward or not",
        "replace",
        "self.backwards != self.mark",
        "True",
        killers=(
            "tests/test_verify_loop_shapes.py::test_a_windows_forwards_before_its_one_backward_are_one_group",
        ),
    ),
    Mutant(
        "freezing between windows taken for freezing inside one",
        "drop-clause",
        "len(self.window) > 0 and now != self.trainable",
        "len(self.window) > 0",
        killers=("tests/test_verify.py::test_report_rows_agree_with_true_gradient",),
    ),
    Mutant(
        "a closure passed positionally not seen",
        "replace",
        "kwargs.get('closure', args[1] if len(args) > 1 else None)",
        "kwargs.get('closure')",
        killers=(
            "tests/test_verify_loop_shapes.py::test_the_last_micro_batch_inside_the_step_closure_counts",
        ),
    ),
    Mutant(
        "the step captured before its closure ran the last micro-batch",
        "replace",
        "out = closure()\ncapture()\nreturn out",
        "capture()\nout = closure()\nreturn out",
        killers=(
            "tests/test_verify_loop_shapes.py::test_the_last_micro_batch_inside_the_step_closure_counts",
        ),
    ),
    Mutant(
        "the closure's return value dropped",
        "replace",
        "capture()\nreturn out",
        "None",
        node="out",
        killers=(
            "tests/test_verify_loop_shapes.py::test_the_last_micro_batch_inside_the_step_closure_counts",
        ),
    ),
    Mutant(
        "another model's optimizer step captured as this model's",
        "replace",
        "not any((id(p) in self.param_ids for g in optimizer.param_groups for p in g['params']))",
        "False",
        killers=(
            "tests/test_verify_boundaries.py::test_another_models_optimizer_and_clip_are_not_this_models",
        ),
    ),
    Mutant(
        "the window's end read from its first micro-batch",
        "replace",
        "self.window[-1]",
        "0",
        node="-1",
        killers=("tests/test_verify.py::test_report_rows_agree_with_true_gradient",),
    ),
    Mutant(
        "a recorded clip not undone before the comparison",
        "drop-factor",
        "gram([grads, o.O()], weights=[1.0 / u, 1.0 / n], scratch=o.scratch)",
        "u",
        node="1.0 / u",
        killers=("tests/test_verify.py::test_clip_of_unscaled_window_passes_and_really_clipped",),
    ),
    Mutant(
        "BatchNorm in eval mode treated as batch statistics",
        "drop-clause",
        "isinstance(mod, BN_TYPES) and mod.training",
        "mod.training",
        killers=(
            "tests/test_verify_boundaries.py::test_eval_mode_batchnorm_after_a_training_epoch_is_exact",
        ),
    ),
    Mutant(
        "micro-batches drawn ahead forgotten at each step",
        "replace",
        "self.window, self.group, self.lrs, self.clips, self.groups, self.scales = ([], [], [], [], [], [])",
        "self.window, self.group, self.lrs, self.clips, self.groups, self.scales, self.fresh = "
        "([], [], [], [], [], [], [])",
        killers=("tests/test_verify.py::test_exact_loop_passes_with_tiny_error",),
    ),
    Mutant(
        "a scheduler change flagged on every later window too",
        "replace",
        "self.how, self.lr_changed, self.untracked, self.frozen_changed = (Replay(), False, 0, False)",
        "self.how, self.untracked, self.frozen_changed = (Replay(), 0, False)",
        killers=(
            "tests/test_verify_boundaries.py::test_a_scheduler_stepped_inside_one_window_flags_that_window_only",
        ),
    ),
    Mutant(
        "stepped windows' items not marked used",
        "replace",
        "self.used_indices.update(self.mbs[b].indices or ())",
        "pass",
        killers=("tests/test_verify.py::test_report_rows_agree_with_true_gradient",),
    ),
    Mutant(
        "micro-batches forwarded after the last step not counted",
        "replace",
        "[rec.mbs[b] for b in rec.window if b in rec.mbs]",
        "[]",
        killers=("tests/test_verify_ragged_tail.py::test_a_tail_forwarded_but_never_stepped_is_dropped",),
    ),
    Mutant(
        "the oracle differentiates frozen parameters too",
        "replace",
        "for leaf, on in zip(self.oracle.leaves, self.trainable):\n    leaf.requires_grad_(on)",
        "True",
        node="on",
        at=1,
        killers=("tests/test_verify_frozen.py::test_freezing_between_steps_is_judged_and_right",),
    ),
    Mutant(
        "a new DataLoader iteration does not end the open pass",
        "delete",
        "if self.data_passes.batches is not None and self.data_passes.drawn > 0:\n"
        "    self.position, self.passes = (0, self.passes + 1)",
        killers=("tests/test_verify_loop_shapes.py::test_a_new_pass_after_one_left_open_has_its_own_tail",),
    ),
    Mutant(
        "a stream that ends between batches does not end the last one's pass",
        "delete",
        "self.mbs[self.drawn - 1].epoch_end = True",
        killers=("tests/test_verify_boundaries.py::test_a_stream_that_ends_between_batches_ends_its_pass",),
    ),
    Mutant(
        "the GradScaler scale of the window not handed to the replay",
        "replace",
        "Replay(self.how.autocast, self.scale)",
        "1.0",
        node="self.scale",
        killers=("tests/test_verify_boundaries.py::test_float16_gradscaler_replay_uses_the_loops_scale",),
    ),
    # ---- oracle: the true gradient and the per-micro-batch fit ------------------------------------------
    Mutant(
        "collinear gradients (one parameter) solved as a 2x2 system",
        "replace",
        "ps * ps >= (1.0 - 1e-09) * pp * ss",
        "False",
        killers=(
            "tests/test_verify_boundaries.py::test_a_one_parameter_model_is_judged_and_its_unscaled_sum_named",
        ),
    ),
    Mutant(
        "a fit's residual relative to |C|^2, not |C|",
        "replace",
        "math.sqrt(cc)",
        "cc",
        killers=("tests/test_verify_blind_spots.py::test_unexplained_says_what_is_known_and_what_to_check",),
    ),
    Mutant(
        "later rescales of .grad not carried to earlier micro-batches' weights",
        "delete",
        "tail *= self.fits[j].beta",
        killers=("tests/test_verify.py::test_clipping_we_cannot_intercept_is_recognised_from_norms",),
    ),
    Mutant(
        "weights scaled by the group count, not the item count",
        "replace",
        "self.items * self.fits[j].a",
        "len(self.fits)",
        node="self.items",
        killers=("tests/test_verify.py::test_report_rows_agree_with_true_gradient",),
    ),
    Mutant(
        "float16 replay at the loop's full scale (the summed loss overflows)",
        "drop-factor",
        "how.scale / max(rows, 1)",
        "max(rows, 1)",
        killers=("tests/test_verify_boundaries.py::test_float16_gradscaler_at_the_default_scale_is_ok",),
    ),
    Mutant(
        "a large model's per-tensor gradient not unscaled",
        "delete",
        "if scale != 1.0:\n    g = g / scale",
        killers=("tests/test_verify_large_models.py::test_a_large_model_gets_the_small_models_verdicts",),
    ),
    Mutant(
        "a leak never seen: .grad at the window's start not checked",
        "replace",
        "any((g is not None and bool(g.any()) for g in grads))",
        "False",
        killers=("tests/test_verify_boundaries.py::test_grad_kept_as_a_decaying_sum_is_no_zero_grad",),
    ),
    Mutant(
        "the oracle's sum not emptied when a window opens",
        "delete",
        "leaf.grad.zero_()",
        within="open",
        killers=("tests/test_verify.py::test_report_rows_agree_with_true_gradient",),
    ),
    Mutant(
        "the oracle draws from the loop's random stream",
        "delete",
        "stack.enter_context(torch.random.fork_rng(devices=[]))",
        killers=("tests/test_verify_blind_spots.py::test_oracle_leaves_the_loops_random_stream_alone",),
    ),
    Mutant(
        "the oracle runs under the optimizer's no_grad",
        "delete",
        "stack.enter_context(torch.enable_grad())",
        killers=(
            "tests/test_verify.py::test_oracle_runs_in_float32_even_when_the_step_happens_under_autocast",
        ),
    ),
    Mutant(
        "the clip coefficient without torch's +1e-6",
        "drop-term",
        "norm_value + 1e-06",
        "1e-06",
        killers=("tests/test_verify_boundaries.py::test_clip_of_a_tiny_gradient_is_undone_exactly",),
    ),
    Mutant(
        "Gram matrix weights not applied",
        "replace",
        "_weighted(out.cpu(), weights)",
        "out.cpu()",
        killers=("tests/test_verify.py::test_report_rows_agree_with_true_gradient",),
    ),
    Mutant(
        "the float32 redo adds to the autocast replay instead of replacing it",
        "delete",
        "for leaf in self.leaves:\n    if leaf.grad is not None:\n        leaf.grad.zero_()",
        killers=("tests/test_verify.py::test_reference_loops_get_their_documented_verdict",),
    ),
    Mutant(
        "a chunked Gram matrix keeps only its first chunk's products",
        "replace",
        "acc += m @ m.T",
        "m @ m.T * (start == 0)",
        node="m @ m.T",
        killers=(
            "tests/test_verify_large_models.py::test_a_change_to_grad_past_a_large_tensors_first_chunk_is_seen",
        ),
    ),
    Mutant(
        "a chunk's scratch rows not refreshed past the first chunk",
        "replace",
        "for i, a in enumerate(rows):\n    scratch[i, :width].copy_(flat[a][start:start + width])",
        "rows[:1]",
        node="rows",
        killers=("tests/test_verify_large_models.py::test_a_large_model_gets_the_small_models_verdicts",),
    ),
    Mutant(
        "finiteness read from the replay, not the loop's gradient",
        "replace",
        "math.isfinite(float(dots[0, 0]))",
        "(2, 2)",
        node="(0, 0)",
        killers=("tests/test_verify.py::test_non_finite_gradient_is_a_finding",),
    ),
    Mutant(
        "sequences counted as items",
        "replace",
        "self.sequences + rows",
        "n",
        node="rows",
        killers=("tests/test_verify_blind_spots.py::test_causal_lm_label_count_before_the_shift_is_named",),
    ),
    Mutant(
        "the window's items counted as rows, not item losses",
        "replace",
        "self.items + n",
        "rows",
        node="n",
        killers=("tests/test_verify.py::test_reference_loops_get_their_documented_verdict",),
    ),
    # ---- api: the run, the copy, coverage ---------------------------------------------------------------
    Mutant(
        "the caller's model trained in place",
        "replace",
        "copy_model(model)",
        "model",
        killers=("tests/test_verify.py::test_model_optimizer_and_data_are_untouched",),
    ),
    Mutant(
        "dropout switched off in the caller's model",
        "replace",
        "disable_dropout(net)",
        "model",
        node="net",
        killers=("tests/test_verify.py::test_dropout_stays_in_the_users_model",),
    ),
    Mutant(
        "verify's loader shuffles",
        "constant",
        "DataLoader(tracked, batch_size=batch_size, shuffle=False, drop_last=False, "
        "collate_fn=rec.collate_fn)",
        "True",
        node="False",
        killers=("tests/test_verify_boundaries.py::test_a_stream_that_ends_between_batches_ends_its_pass",),
    ),
    Mutant(
        "verify's loader drops the last micro-batch",
        "constant",
        "DataLoader(tracked, batch_size=batch_size, shuffle=False, drop_last=False, "
        "collate_fn=rec.collate_fn)",
        "True",
        node="False",
        at=1,
        killers=("tests/test_verify.py::test_report_rows_agree_with_true_gradient",),
    ),
    Mutant(
        "max_steps not forwarded to the recorder",
        "replace",
        "max_steps",
        "None",
        within="_run",
        killers=("tests/test_verify_data.py::test_max_steps_judges_exactly_n_steps_and_ends_the_loop",),
    ),
    Mutant(
        "a run ended by max_steps not said",
        "constant",
        "stopped = True",
        "False",
        node="True",
        within="_run",
        killers=("tests/test_verify_data.py::test_max_steps_judges_exactly_n_steps_and_ends_the_loop",),
    ),
    Mutant(
        "the loop's own error wrapped as verify's",
        "replace",
        "_raised_by_verify(err)",
        "True",
        killers=("tests/test_verify.py::test_train_fn_error_reaches_caller_with_note",),
    ),
    Mutant(
        "an optimizer instance over the caller's parameters accepted",
        "replace",
        "isinstance(optimizer, torch.optim.Optimizer)",
        "False",
        killers=("tests/test_verify.py::test_an_optimizer_instance_is_refused_with_the_factory_to_write",),
    ),
    Mutant(
        "items of different sizes without a collate_fn not refused up front",
        "replace",
        "collate_fn is None and (not isinstance(dataset, IterableDataset))",
        "False",
        killers=(
            "tests/test_verify.py::test_items_of_different_sizes_without_collate_fn_are_refused_before_the_loop_runs",
        ),
    ),
    Mutant(
        "batch_size 0 accepted",
        "constant",
        "check_callable('item_losses', item_losses, 'item_losses(model, batch)')\n"
        "check_int('batch_size', batch_size, low=1)",
        "0",
        node="1",
        killers=("tests/test_verify.py::test_bad_input_names_argument_rule_and_value",),
    ),
    Mutant(
        "items drawn by a complete pass but never stepped counted as left out by design",
        "replace",
        "left = [i for i in left if i in passes.seen]",
        "pass",
        killers=("tests/test_verify_samplers.py::test_drop_last_is_a_stated_choice_not_an_early_step",),
    ),
    Mutant(
        "a logged loss off by k only caught one way",
        "drop-clause",
        "close(r * k, 1.0) or close(r / k, 1.0)",
        "close(r / k, 1.0)",
        killers=("tests/test_verify_blind_spots.py::test_logged_loss_off_by_k_either_way",),
    ),
    Mutant(
        "the true loss leaves out what was forwarded after the last step",
        "drop-term",
        "sum((s.loss_sum for s in steps)) + cov.seen_loss",
        "cov.seen_loss",
        killers=("tests/test_verify_ragged_tail.py::test_a_tail_forwarded_but_never_stepped_is_dropped",),
    ),
    Mutant(
        "the generic fix given for misscaled, not the cause's own",
        "replace",
        "if found:\n    fixes['misscaled'] = '; '.join((CAUSES[c][1] for c in found))",
        "False",
        node="found",
        killers=("tests/test_verify_boundaries.py::test_divided_by_k_too_often_names_cause_1_over_k",),
    ),
    Mutant(
        "the rows of an assumed clip not compared with the clipped truth",
        "replace",
        "[assumed] if assumed else []",
        "[]",
        killers=(
            "tests/test_verify_blind_spots.py::test_clip_verify_did_not_see_is_stated_as_an_assumption",
        ),
    ),
    Mutant(
        "coverage judged after data verify never handed out",
        "drop-clause",
        "stopped or any((f.code == 'untracked-data' for f in found))",
        "any((f.code == 'untracked-data' for f in found))",
        killers=("tests/test_verify_data.py::test_data_verify_never_handed_out_is_said_not_misnamed",),
    ),
    Mutant(
        "the misscaled span's range collapsed to its first step",
        "replace",
        "f'c = {min(cs):.4f}' + (f' to {max(cs):.4f}' if max(cs) - min(cs) >= 5e-05 else '')",
        "f'c = {cs[0]:.4f}'",
        killers=(
            "tests/test_verify_ragged_tail.py::test_a_mean_divided_by_its_windows_item_count_names_cause_1_over_b_on_a_ragged_tail",
        ),
    ),
    Mutant(
        "the BatchNorm limit reported only for wrong steps",
        "drop-clause",
        "v.batchnorm_limit or v.codes",
        "v.batchnorm_limit",
        killers=("tests/test_verify.py::test_reference_loops_get_their_documented_verdict",),
    ),
    Mutant(
        "the global step hook left registered after the run",
        "replace",
        "for h in hooks:\n    h.remove()\nrec.unwatch()",
        "hooks[:2]",
        node="hooks",
        killers=(
            "tests/test_verify_untouched.py::test_torch_is_left_as_verify_found_it_after_a_run_a_max_steps_stop_and_an_error",
        ),
    ),
    # ---- report: what the caller reads --------------------------------------------------------------------
    Mutant(
        "ok when any finding passes, not all",
        "replace",
        "all((f.severity in PASSING for f in self.findings))",
        "any",
        node="all",
        killers=("tests/test_verify.py::test_exact_loop_passes_with_tiny_error",),
    ),
    Mutant(
        "a limit outranks a bug in the status",
        "replace",
        "'bug' if 'bug' in kinds else 'cannot-judge' if 'limit' in kinds else 'ok'",
        "'cannot-judge' if 'limit' in kinds else 'bug' if 'bug' in kinds else 'ok'",
        killers=(
            "tests/test_verify_report_text.py::test_a_bug_beside_a_limit_is_a_bug_and_the_limit_alone_cannot_judge",
        ),
    ),
    Mutant(
        "cannot-judge exits like a bug",
        "constant",
        "{'ok': 0, 'bug': 1, 'usage': 2, 'raised': 3, 'cannot-judge': 4}",
        "1",
        node="4",
        killers=(
            "tests/test_verify_report_text.py::test_a_bug_beside_a_limit_is_a_bug_and_the_limit_alone_cannot_judge",
        ),
    ),
    Mutant(
        "NaN written to JSON",
        "replace",
        "None if isinstance(v, float) and (not math.isfinite(v)) else v",
        "v",
        killers=("tests/test_verify.py::test_json_stays_valid_when_a_step_has_no_reference",),
    ),
    Mutant(
        "the clip column shown on every report",
        "replace",
        "any((s.clip < 1 for s in self.steps))",
        "True",
        killers=("tests/test_verify_boundaries.py::test_clip_column_only_when_a_step_was_clipped",),
    ),
    Mutant(
        "the verdict line says OK for a limit",
        "replace",
        "self.status == 'cannot-judge'",
        "False",
        killers=(
            "tests/test_verify_report_text.py::test_a_bug_beside_a_limit_is_a_bug_and_the_limit_alone_cannot_judge",
        ),
    ),
    Mutant(
        "HTML messages not escaped",
        "replace",
        "html.escape(f.message)",
        "f.message",
        killers=("tests/test_verify_report_text.py::test_html_shows_a_message_as_text",),
    ),
    Mutant(
        "a finding's steps not printed",
        "replace",
        "f\" (steps {', '.join(map(str, self.steps))})\" if self.steps else ''",
        "''",
        killers=(
            "tests/test_verify_report_text.py::test_the_text_names_each_findings_steps_and_the_verdict",
        ),
    ),
    Mutant(
        "items of a stream shown as 0, not unknown",
        "replace",
        "lines = text_table(head, body)\ntotal = '?' if self.items_total is None else str(self.items_total)",
        "str(self.items_total or 0)",
        node="'?' if self.items_total is None else str(self.items_total)",
        killers=("tests/test_verify_report_text.py::test_an_unknown_item_count_reads_as_unknown_not_zero",),
    ),
    Mutant(
        "a finding's severity left out of the JSON",
        "drop-factor",
        "asdict(f) | {'severity': f.severity}",
        "{'severity': f.severity}",
        killers=(
            "tests/test_verify_report_text.py::test_the_text_names_each_findings_steps_and_the_verdict",
        ),
    ),
    Mutant(
        "a cost finding fails the verdict",
        "replace",
        "('note', 'cost')",
        "('note',)",
        killers=(
            "tests/test_verify_ranks.py::test_sync_after_every_micro_batch_is_right_with_a_cost_finding",
        ),
        tests=RANKS,
    ),
    Mutant(
        "a sampler's duplicate items called a bug",
        "constant",
        "Code('note', '{n} draw(s) repeated a dataset item already drawn in the same pass (a sampler "
        "with replacement, or padding): each copy weighs as one item, in the loop and in the large "
        "batch it is judged against', 'nothing to fix if the sampler repeats items on purpose; a "
        "DistributedSampler pads ranks this way (with drop_last=False it repeats up to R-1 items per "
        "pass so every rank holds as many)', said={'job': \"{message} (counted over every rank's "
        'draws)"}, meaning="a sampler drew an item twice in one pass (replacement; across ranks, a '
        "`DistributedSampler`'s padding); each draw weighs as one item, in the loop and in the "
        'oracle")',
        "'bug'",
        node="'note'",
        killers=("tests/test_verify_samplers.py::test_a_sampler_with_replacement_repeats_items_and_says_so",),
    ),
    Mutant(
        "an assumed clip called a bug",
        "constant",
        "Code('note', 'torch clipped nothing (no clip_grad_norm_ or clip_grads_with_norm_, by any "
        "name), but the scaled steps all end at one norm: verify assumes the loop clips with a "
        "function of its own and compares those steps with the oracle clipped to that norm', \"nothing "
        "to fix if the loop clips on purpose; clip with torch's clip_grad_norm_ (any import style) to "
        "have it checked, not assumed\", said={'norm': '{message} (max_norm ~= {max_norm:.4g})'}, "
        'meaning="torch clipped nothing (by any name), but two or more steps were shrunk to one norm '
        "and nothing contradicts a clip there: a clip of the loop's own (fairseq, DeepSpeed) is "
        'assumed, and said")',
        "'bug'",
        node="'note'",
        killers=("tests/test_verify.py::test_clipping_we_cannot_intercept_is_recognised_from_norms",),
    ),
    Mutant(
        "the loss the loop reported not printed",
        "replace",
        "self.logged_loss is not None and self.true_loss is not None",
        "False",
        killers=(
            "tests/test_verify_report_text.py::test_the_loss_the_loop_reported_is_printed_beside_the_true_one",
        ),
    ),
    # ---- copying: the caller's objects are never reached -----------------------------------------------
    Mutant(
        "instance-patched methods left pointing at the caller's model",
        "replace",
        "copied[name] = _rebound(value, memo, done)",
        "pass",
        killers=(
            "tests/test_verify_untouched.py::test_the_callers_patched_model_is_untouched_and_the_copy_judged",
        ),
    ),
    Mutant(
        "hooks closing over the caller's model not rebuilt",
        "replace",
        "name.endswith('hooks') and isinstance(value, dict)",
        "False",
        killers=(
            "tests/test_verify_untouched.py::test_the_callers_patched_model_is_untouched_and_the_copy_judged",
        ),
    ),
    Mutant(
        "functions with defaults but no closure not rebuilt",
        "replace",
        "not obj.__closure__ and (not obj.__defaults__) and (not obj.__kwdefaults__)",
        "not obj.__closure__",
        killers=(
            "tests/test_verify_untouched.py::test_the_callers_patched_model_is_untouched_and_the_copy_judged",
        ),
    ),
    Mutant(
        "a partial's arguments not rebuilt",
        "replace",
        "(_rebound(a, memo, done) for a in obj.args)",
        "obj.args",
        killers=(
            "tests/test_verify_untouched.py::test_the_callers_patched_model_is_untouched_and_the_copy_judged",
        ),
    ),
    Mutant(
        "a bound method's instance not rebuilt",
        "replace",
        "_rebound(obj.__self__, memo, done)",
        "obj.__self__",
        killers=(
            "tests/test_verify_untouched.py::test_the_callers_patched_model_is_untouched_and_the_copy_judged",
        ),
    ),
    Mutant(
        "only the top module's patched methods rebuilt",
        "replace",
        "model.modules()",
        "[model]",
        within="copy_model",
        killers=(
            "tests/test_verify_untouched.py::test_the_callers_patched_model_is_untouched_and_the_copy_judged",
        ),
    ),
    Mutant(
        "a rebuilt function keeps the original's default arguments",
        "replace",
        "tuple((_rebound(d, memo, done) for d in obj.__defaults__)) if obj.__defaults__ else None",
        "obj.__defaults__",
        killers=(
            "tests/test_verify_untouched.py::test_the_callers_patched_model_is_untouched_and_the_copy_judged",
        ),
    ),
    Mutant(
        "closure cells copied as they were",
        "replace",
        "_rebound(old.cell_contents, memo, done)",
        "old.cell_contents",
        killers=(
            "tests/test_verify_untouched.py::test_the_callers_patched_model_is_untouched_and_the_copy_judged",
        ),
    ),
    # ---- shadow, sources, patches ----------------------------------------------------------------------------
    Mutant(
        "the shadow's leaves always require grad",
        "replace",
        "torch.nn.Parameter(p.detach(), requires_grad=p.requires_grad)",
        "True",
        node="p.requires_grad",
        equivalent="sync_shadow, run when the Recorder is built and at every window's first forward, sets each "
        "kept leaf's requires_grad from the loop's parameter, and _close_group sets it again before every "
        "replay, so no gradient, weight or verdict changes; the one trace is a zero .grad buffer opened "
        "for a frozen parameter the loop replaced (cast or moved) before a window opened: memory only",
    ),
    Mutant(
        "the shadow keeps its own train/eval mode",
        "delete",
        "s.training = m.training",
        killers=(
            "tests/test_verify_boundaries.py::test_eval_mode_batchnorm_after_a_training_epoch_is_exact",
        ),
    ),
    Mutant(
        "a sweep over the dataset by iteration counted as micro-batch reads",
        "replace",
        "i > 0 and self.pending[-i:] == list(range(i))",
        "False",
        killers=(
            "tests/test_verify_loop_shapes.py::test_a_length_sweep_by_iteration_then_the_loops_own_padding_is_followed",
        ),
    ),
    Mutant(
        "a worker of the loop's own loader not refused",
        "replace",
        "get_worker_info() is not None",
        "False",
        within="__getitem__",
        killers=(
            "tests/test_verify_loop_shapes.py::test_a_prefetching_worker_loader_is_refused_not_misjudged",
        ),
    ),
    Mutant(
        "a batch sampler's drop_last not read",
        "drop-clause",
        "getattr(loader, 'drop_last', False) or getattr(batches, 'drop_last', False)",
        "getattr(batches, 'drop_last', False)",
        killers=(
            "tests/test_verify_loop_shapes.py::test_a_batch_samplers_drop_last_is_named_as_why_items_were_left_out",
        ),
    ),
    Mutant(
        "a pass without a length ends only past the dataset's size (its short tail read as early-step)",
        "compare",
        "self.items >= self.held",
        ">",
        killers=(
            "tests/test_verify_samplers.py::test_a_sampler_without_a_length_ends_its_pass_at_its_last_item",
        ),
    ),
    Mutant(
        "a pass ends only once every item was drawn, whatever the loader's length",
        "replace",
        "self.drawn == self.batches if self.batches is not None else self.items >= self.held",
        "self.items >= self.held",
        killers=("tests/test_verify_samplers.py::test_drop_last_is_a_stated_choice_not_an_early_step",),
    ),
    Mutant(
        "repeated draws in a pass counted once too many",
        "drop-term",
        "(c - 1 for c in self.counts.values())",
        "1",
        node="c - 1",
        killers=("tests/test_verify.py::test_report_rows_agree_with_true_gradient",),
    ),
    Mutant(
        "another model's clip recorded as this model's",
        "replace",
        "any((id(p) in rec.param_ids for p in params))",
        "True",
        killers=(
            "tests/test_verify_boundaries.py::test_another_models_optimizer_and_clip_are_not_this_models",
        ),
    ),
    Mutant(
        "a step GradScaler skipped merged into the next window",
        "replace",
        "len(rec.steps) == before",
        "False",
        killers=("tests/test_verify.py::test_window_skipped_by_gradscaler_is_not_merged_into_the_next",),
    ),
    Mutant(
        "DataLoader iteration left patched after the run",
        "delete",
        "DataLoader.__iter__ = original",
        killers=(
            "tests/test_verify_untouched.py::test_torch_is_left_as_verify_found_it_after_a_run_a_max_steps_stop_and_an_error",
        ),
    ),
    Mutant(
        "GradScaler left patched after the run",
        "replace",
        "torch.amp.GradScaler.step, torch.amp.GradScaler.scale = (step, scale)",
        "pass",
        killers=(
            "tests/test_verify_untouched.py::test_torch_is_left_as_verify_found_it_after_a_run_a_max_steps_stop_and_an_error",
        ),
    ),
    Mutant(
        "a scheduler stepped between windows flagged",
        "drop-clause",
        "ours and rec.window and (lrs(opt) != before)",
        "rec.window",
        killers=("tests/test_verify_blind_spots.py::test_scheduler_per_micro_batch_at_k2",),
    ),
    # ---- job and ranks: a multi-rank job (the ranks test: one launch) ---------------------------------------
    Mutant(
        "uneven steps across ranks not reported",
        "replace",
        "if len(set(counts)) > 1:\n"
        "    job.findings.append(Finding.of('uneven-steps', form='per-rank', counts=counts))",
        "False",
        node="len(set(counts)) > 1",
        killers=(
            "tests/test_verify_ranks.py::test_every_example_loop_gets_exactly_the_codes_it_is_listed_with",
        ),
        tests=RANKS,
    ),
    Mutant(
        "padding repeats across ranks not counted",
        "replace",
        "sum((c - 1 for counter in per_pass.values() for c in counter.values()))",
        "0",
        killers=("tests/test_verify_ranks.py::test_distributed_sampler_padding_repeats_items",),
        tests=RANKS,
    ),
    Mutant(
        "the job's sum not all-reduced (each rank's own oracle)",
        "replace",
        "dist.all_reduce(self._flat(sums, like))",
        "self._flat(sums, like)",
        killers=(
            "tests/test_verify_ranks.py::test_every_example_loop_gets_exactly_the_codes_it_is_listed_with",
        ),
        tests=RANKS,
    ),
    Mutant(
        "a rank's engine that cannot vouch for its run not heard by the others (the job stays in place)",
        "replace",
        "if said:\n"
        "    raise Fallback('; '.join((f'rank {r}: {why}' if self.world > 1 else why for r, why in "
        "said)))",
        "False",
        node="said",
        killers=(
            "tests/test_verify_ranks.py::test_every_example_loop_gets_exactly_the_codes_it_is_listed_with",
        ),
        tests=RANKS,
    ),
    Mutant(
        "the ranks' in-place sums added where they lie without comparing the orders they lie in",
        "drop-clause",
        "own is not None and all((e['block'] == own[1] for e in every))",
        "all((e['block'] == own[1] for e in every))",
        killers=(
            "tests/test_verify_ranks.py::test_ranks_whose_optimizers_order_the_parameters_apart_are_judged_as_one_job",
        ),
        tests=RANKS,
    ),
    Mutant(
        "ranks taken as holding the same gradient and parameters without comparing their checksums",
        "drop-clause",
        "every[0]['same'] is None or any((e['same'] != every[0]['same'] for e in every))",
        "any((e['same'] != every[0]['same'] for e in every))",
        killers=(
            "tests/test_verify_ranks.py::test_every_example_loop_gets_exactly_the_codes_it_is_listed_with",
        ),
        tests=RANKS,
    ),
    Mutant(
        "the ranks' oracles said as rank 0's alone",
        "replace",
        "len(set(oracles)) > 1",
        "False",
        killers=(
            "tests/test_verify_ranks.py::test_a_penalty_on_one_rank_hands_that_ranks_windows_to_the_recompute_oracle",
        ),
        tests=RANKS,
    ),
    # ---- cli -------------------------------------------------------------------------------------------------
    Mutant(
        "the command line exits 0 whatever the verdict",
        "replace",
        "print(report.to_json() if args.json else report)\nreturn report.exit_status",
        "0",
        node="report.exit_status",
        killers=("tests/test_verify_cli.py::test_file_defined_task",),
    ),
    Mutant(
        "--accum-steps ignored when the file sets ACCUM_STEPS",
        "replace",
        "args.accum_steps if args.accum_steps is not None else kw['accum_steps']",
        "kw['accum_steps'] or args.accum_steps",
        within="run_target",
        killers=("tests/test_verify_cli.py::test_bad_usage_exits_2",),
    ),
    # ---- tolerances: each loosened 10x (or tightened where a tight value fails correct loops) --------------
    Mutant(
        "FLOAT32_RTOL loosened 10x",
        "constant",
        "FLOAT32_RTOL = 0.0001",
        "0.001",
        node="0.0001",
        killers=("tests/test_verify_boundaries.py::test_a_misscale_of_five_hundredths_of_a_percent_fails",),
    ),
    Mutant(
        "AUTOCAST_RTOL loosened 10x",
        "constant",
        "AUTOCAST_RTOL = 0.01",
        "0.1",
        node="0.01",
        killers=("tests/test_verify_blind_spots.py::test_uniform_misscale_is_misscaled_with_its_factor",),
    ),
    Mutant(
        "FIT_RTOL loosened 10x",
        "constant",
        "FIT_RTOL = 0.001",
        "0.01",
        node="0.001",
        killers=("tests/test_verify_blind_spots.py::test_unexplained_says_what_is_known_and_what_to_check",),
    ),
    Mutant(
        "SAME_FACTOR_RTOL loosened 10x",
        "constant",
        "SAME_FACTOR_RTOL = 0.01",
        "0.1",
        node="0.01",
        killers=(
            "tests/test_verify_boundaries.py::test_weights_that_drift_a_few_percent_are_not_one_factor",
        ),
    ),
    Mutant(
        "COEF_RTOL loosened 10x",
        "constant",
        "COEF_RTOL = 0.05",
        "0.5",
        node="0.05",
        killers=(
            "tests/test_verify_boundaries.py::test_no_zero_grad_under_gradscaler_at_a_small_scale_is_named",
        ),
    ),
    Mutant(
        "SCALED_CLIP_RATIO loosened 10x",
        "constant",
        "SCALED_CLIP_RATIO = 1.5",
        "15",
        node="1.5",
        killers=("tests/test_verify_blind_spots.py::test_clip_before_unscale_at_any_scale",),
    ),
    Mutant(
        "CLIP_NORM_RTOL loosened 10x",
        "constant",
        "CLIP_NORM_RTOL = 0.001",
        "0.01",
        node="0.001",
        killers=(
            "tests/test_verify_boundaries.py::test_norms_two_tenths_of_a_percent_apart_are_not_one_clip",
        ),
    ),
    Mutant(
        "LOGGED_RTOL loosened 10x",
        "constant",
        "LOGGED_RTOL = 0.1",
        "1.0",
        node="0.1",
        killers=("tests/test_verify.py::test_logged_per_step_list_checked",),
    ),
    Mutant(
        "BF16_RTOL tightened 10x (bf16 figures read as float32 ones)",
        "constant",
        "BF16_RTOL = 0.1",
        "0.01",
        node="0.1",
        killers=("tests/test_verify.py::test_reference_loops_get_their_documented_verdict",),
    ),
]
