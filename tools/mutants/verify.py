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

# diagnose names one step from its numbers; diagnose_run applies the run-level rules (an assumed clip,
# a constant divisor, a masked misscale); coverage counts the items a run used; measure a step's numbers
D, DR = "accumlib/_verify/diagnose.py", "accumlib/_verify/diagnose_run.py"
CV, ME = "accumlib/_verify/coverage.py", "accumlib/_verify/measure.py"
R, OR, A = "accumlib/_verify/record.py", "accumlib/_verify/window_oracle.py", "accumlib/_verify/api.py"
P, C, T = "accumlib/_verify/report.py", "accumlib/_verify/copying.py", "accumlib/tolerances.py"
S, SH, PA = "accumlib/_verify/sources.py", "accumlib/_verify/shadow.py", "accumlib/_verify/patches.py"
J, RK, CLI = "accumlib/_verify/job.py", "accumlib/_verify/ranks.py", "accumlib/_verify/cli.py"
CO, IV = "accumlib/_verify/codes.py", "accumlib/_verify/inplace_verify.py"

MUTANTS = [
    # ---- judged in place: the engine's figures, and when the recompute oracle takes over ------------------
    Mutant(
        "the one-window check passes any gradient", IV, "not gap <= ROUNDING_FLOOR", "not gap <= math.inf"
    ),
    Mutant("the one-window check ignores the item counts", IV, "if replayed != items or", "if"),
    Mutant("a step the engine could not judge taken in place", IV, "    if limits:\n", "    if False:\n"),
    Mutant(
        "a factor applied after the last backward left out of the weights",
        IV,
        "numbers.weights = [w * after for w in got.weights]",
        "numbers.weights = list(got.weights)",
    ),
    Mutant(
        "the recompute oracle never takes a run over",
        IV,
        "    if not why:\n        return False",
        "    if True:\n        return False",
    ),
    # ---- diagnose: naming a step from its numbers -------------------------------------------------------
    Mutant("a skipped GradScaler step judged like any other", D, "    if n.skipped:\n", "    if False:\n"),
    Mutant(
        "a step without micro-batches after untracked forwards called early-step",
        D,
        '        if n.untracked:\n            out.codes.append("untracked-data")',
        '        if False:\n            out.codes.append("untracked-data")',
    ),
    Mutant("a non-finite gradient not reported", D, "    if not n.finite:\n", "    if False:\n"),
    Mutant("a window without items not reported", D, "    if n.items == 0:\n", "    if False:\n"),
    Mutant(
        "learning rates compared only between windows, not inside one",
        D,
        "if n.lr_changed or len(set(n.lrs)) > 1:",
        "if n.lr_changed:",
    ),
    Mutant("freezing inside a window ignored", D, "    if n.frozen_changed:  #", "    if False:  #"),
    Mutant(
        "any short window that ends a pass excused, whatever its size",
        D,
        "early = m < k and not (n.epoch_end and m == n.pass_length % k)",
        "early = m < k and not n.epoch_end",
    ),
    Mutant(
        "a window longer than k not named (k = 4 where 2 is asked, one step per epoch pass)",
        D,
        '    if m > k:\n        out.codes.append("late-step")',
        '    if False:\n        out.codes.append("late-step")',
    ),
    Mutant(
        "a long window that ends a pass excused like a short tail (a tail merged into the last window)",
        D,
        '    if m > k:\n        out.codes.append("late-step")',
        '    if m > k and not n.epoch_end:\n        out.codes.append("late-step")',
    ),
    Mutant(
        "c = m/k on a late window named misscaled (loss / k is right for the k asked)",
        D,
        "    if m > k and near(c, m / k, tol):",
        "    if False:",
    ),
    Mutant(
        "every factor on a late window excused, not only c = m/k",
        D,
        "    if m > k and near(c, m / k, tol):",
        "    if m > k:",
    ),
    Mutant(
        "a late step taken to explain a gradient no bug explains (unexplained not said)",
        D,
        'schedule = ("scheduler-per-micro-batch", "frozen-inside-window", "late-step")',
        'schedule = ("scheduler-per-micro-batch", "frozen-inside-window")',
    ),
    Mutant(
        "a late step's count said as the asked k, not the micro-batches it averaged",
        DR,
        'ms = sorted({numbers[t].micro_batches for t in at["late-step"]})',
        "ms = [k]",
    ),
    Mutant(
        "a clip one micro-batch before the window's end counted as complete",
        D,
        "if any(0 < c.seen < m for c in n.clips):",
        "if any(0 < c.seen < m - 1 for c in n.clips):",
    ),
    Mutant(
        "clip-before-unscale ratio loosened 10x",
        D,
        "if seen > SCALED_CLIP_RATIO and",
        "if seen > 10 * SCALED_CLIP_RATIO and",
    ),
    Mutant(
        "every loop judged at the autocast tolerance",
        D,
        'return FLOAT32_RTOL if precision == "float32" else AUTOCAST_RTOL',
        "return AUTOCAST_RTOL",
    ),
    Mutant(
        "a step judged ok at 10x the rounding tolerance",
        D,
        "    if n.rel <= tol:\n        out.batchnorm_limit",
        "    if n.rel <= 10 * tol:\n        out.batchnorm_limit",
        at=0,
    ),
    Mutant(
        "fits accepted at the tighter of the two tolerances (min for max)",
        D,
        "    fit_tol = max(FIT_RTOL, tol)  # a fit is as good",
        "    fit_tol = min(FIT_RTOL, tol)  # a fit is as good",
    ),
    Mutant(
        "a leak named only when it is most of the gradient",
        D,
        "if n.leak and n.leak_coef > COEF_RTOL:",
        "if n.leak and n.leak_coef > 0.5:",
    ),
    Mutant(
        "a window's micro-batches all small but one factor called a zeroing",
        D,
        "    if any(near0) and not one_factor:",
        "    if any(near0):",
    ),
    Mutant(
        "a near-zero weight anywhere taken for all zero (no zero-grad-inside-window)",
        D,
        "        if not all(near0):\n",
        "        if not any(near0):\n",
    ),
    Mutant(
        "tail-misscaled judged against m, not k",
        D,
        "if m < k and near(v[0] * k, 1.0, tol):",
        "if m < k and near(v[0] * m, 1.0, tol):",
    ),
    Mutant(
        "means of unequal micro-batches off by one factor not named (over-division: unexplained)",
        D,
        "        if unequal and v[0] > 0:",
        "        if False:",
    ),
    Mutant(
        "a short window at m/k per micro-batch not tail-misscaled",
        D,
        "    if m < k and all(near(x, m / k, tol) for x in w):",
        "    if False:",
    ),
    Mutant(
        "misscaled named despite a leak",
        D,
        "if not n.leak and all(near(x, w[0], SAME_FACTOR_RTOL) for x in w):",
        "if all(near(x, w[0], SAME_FACTOR_RTOL) for x in w):",
    ),
    Mutant(
        "the label-shift cause offered for items that are not tokens",
        D,
        "        if 0 < sequences < items\n",
        "        if 0 < sequences <= items\n",
    ),
    Mutant("cause 1/m never predicted", D, '([("1/m", 1 / m)] if m > 1 else [])', "[]"),
    Mutant(
        "cause 1/b predicted only for full windows (a short tail over k x b blamed on item_losses)",
        D,
        '        known += [("1/b", m * m / (k * items))] if m < k else []',
        "        known += []",
    ),
    Mutant(
        "cause 1/b predicted as k/N (right on full windows only: a short tail's m/N named a reduction)",
        D,
        '        known += [("1/b", m / items)]',
        '        known += [("1/b", k / items)]',
    ),
    Mutant(
        "cause 1/b predicted as 1/m",
        D,
        '        known += [("1/b", m / items)]',
        '        known += [("1/b", 1 / m)]',
    ),
    Mutant(
        "a whole ratio of 1 taken for a reduction",
        D,
        "if d >= 2 and near(c, d if c >= 1 else 1 / d, rtol):",
        "if d >= 1 and near(c, d if c >= 1 else 1 / d, rtol):",
    ),
    Mutant(
        "one scaled step taken as evidence of a clip",
        DR,
        "if len(scaled) < 2 or any(",
        "if len(scaled) < 1 or any(",
    ),
    Mutant(
        "a clip refuted only when every step scales up, not any",
        DR,
        "any(v.factor is None or _shrink(s, v) >= 1 for s, v in scaled)",
        "all(v.factor is None or _shrink(s, v) >= 1 for s, v in scaled)",
    ),
    Mutant(
        "clip norms matched 10x more loosely",
        DR,
        "if all(near(x, c, CLIP_NORM_RTOL) for x in norms)",
        "if all(near(x, c, 10 * CLIP_NORM_RTOL) for x in norms)",
    ),
    Mutant(
        "ok steps above the clip norm do not refute the clip",
        DR,
        " and all(x <= c * (1 + CLIP_NORM_RTOL) for x in fine)",
        "",
    ),
    Mutant(
        "a constant divisor named from a single window size",
        DR,
        "if assumed is None and len({s.items for s, _ in scaled}) > 1:",
        "if assumed is None and len({s.items for s, _ in scaled}) >= 1:",
    ),
    Mutant(
        "a misscale masked by clipping judged on the norm ratio, not the error",
        DR,
        "v.masked = like_for_like(s, done)[1] <= step_tol",
        "v.masked = like_for_like(s, done)[0] <= step_tol",
    ),
    Mutant(
        "the clipped truth ignores the +1e-6 of torch's clip",
        DR,
        "lam *= min(1.0, max_norm / (lam * math.sqrt(n.tt) + 1e-6))",
        "lam *= min(1.0, max_norm / (lam * math.sqrt(n.tt)))",
    ),
    Mutant(
        "a scheduler code counted as explaining the gradient",
        D,
        "return out.window_scale or any(c not in schedule for c in out.codes)",
        "return bool(out.codes)",
    ),
    Mutant(
        "ranks that hold different parameters not diverged",
        D,
        "if max(n.diverged, n.params_diverged) > tol:",
        "if n.diverged > tol:",
        tests=RANKS_PARAMS,
    ),
    Mutant(
        "a per-rank mean not told apart from a common factor",
        D,
        "    elif n.per_rank_resid <= fit_tol:",
        "    elif False:",
        tests=RANKS,
    ),
    # ---- record: hooks on verify's copy -----------------------------------------------------------------
    Mutant(
        "a collate after the loop read the dataset takes the oldest reads as the batch",
        R,
        "self.dataset.pending[len(self.dataset.pending) - len(samples) :]",
        "self.dataset.pending[: len(samples)]",
    ),
    Mutant(
        "an iterable dataset's drawn count never reset per batch",
        R,
        "            self.dataset.pending = 0\n",
        "",
    ),
    Mutant(
        "a merged forward matched to the newest micro-batches drawn",
        R,
        "        for b in self.fresh:  # several micro-batches merged",
        "        for b in reversed(self.fresh):  # several micro-batches merged",
    ),
    Mutant(
        "a merged forward matched to more rows than it holds",
        R,
        "if len(taken) > 1 and total == rows:",
        "if len(taken) > 1 and total >= rows:",
    ),
    Mutant(
        "a second forward of a used micro-batch counted as a new one",
        R,
        "new = [b for b in ids if b not in self.consumed]",
        "new = list(ids)",
    ),
    Mutant(
        "a group closed at every forward, backward or not",
        R,
        "elif self.backwards != self.mark:",
        "elif True:",
    ),
    Mutant(
        "freezing between windows taken for freezing inside one",
        R,
        "self.frozen_changed |= len(self.window) > 0 and now != self.trainable",
        "self.frozen_changed |= now != self.trainable",
    ),
    Mutant(
        "a closure passed positionally not seen",
        PA,
        'closure = kwargs.get("closure", args[1] if len(args) > 1 else None)',
        'closure = kwargs.get("closure")',
    ),
    Mutant(
        "the step captured before its closure ran the last micro-batch",
        PA,
        "        out = closure()\n        capture()",
        "        capture()\n        out = closure()",
    ),
    Mutant(
        "the closure's return value dropped",
        PA,
        "        capture()\n        return out",
        "        capture()\n        return None",
    ),
    Mutant(
        "another model's optimizer step captured as this model's",
        R,
        '        if not any(id(p) in self.param_ids for g in optimizer.param_groups for p in g["params"]):\n            return None  # another',
        "        if False:\n            return None  # another",
    ),
    Mutant(
        "the window's end read from its first micro-batch",
        R,
        "last = self.mbs[self.window[-1]]",
        "last = self.mbs[self.window[0]]",
    ),
    Mutant(
        "a recorded clip not undone before the comparison",
        ME,
        "gram([grads, o.O()], weights=[1.0 / u, 1.0 / n], scratch=o.scratch)",
        "gram([grads, o.O()], weights=[1.0, 1.0 / n], scratch=o.scratch)",
    ),
    Mutant(
        "BatchNorm in eval mode treated as batch statistics",
        R,
        "isinstance(mod, BN_TYPES) and mod.training for mod",
        "isinstance(mod, BN_TYPES) for mod",
    ),
    Mutant(
        "micro-batches drawn ahead forgotten at each step",
        R,
        "self.window, self.group, self.lrs, self.clips, self.groups = [], [], [], [], []",
        "self.window, self.group, self.lrs, self.clips, self.groups, self.fresh = [], [], [], [], [], []",
    ),
    Mutant(
        "a scheduler change flagged on every later window too",
        R,
        "self.how, self.lr_changed, self.untracked, self.frozen_changed = Replay(), False, 0, False",
        "self.how, self.untracked, self.frozen_changed = Replay(), 0, False",
    ),
    Mutant(
        "stepped windows' items not marked used",
        R,
        "            self.used_indices.update(self.mbs[b].indices or ())\n",
        "            pass\n",
    ),
    Mutant(
        "micro-batches forwarded after the last step not counted",
        "accumlib/_verify/coverage.py",
        "return [rec.mbs[b] for b in rec.window if b in rec.mbs]",
        "return []",
    ),
    Mutant(
        "the oracle differentiates frozen parameters too",
        R,
        "            leaf.requires_grad_(on)  # as the loop's forward",
        "            leaf.requires_grad_(True)  # as the loop's forward",
    ),
    Mutant(
        "a new DataLoader iteration does not end the open pass",
        R,
        "            if self.data_passes.batches is not None and self.data_passes.drawn > 0:  # the open pass ends here\n"
        "                self.position, self.passes = 0, self.passes + 1\n",
        "",
    ),
    Mutant(
        "a stream that ends between batches does not end the last one's pass",
        R,
        "            self.mbs[self.drawn - 1].epoch_end = True\n",
        "",
    ),
    Mutant(
        "the GradScaler scale of the window not handed to the replay",
        R,
        "Replay(self.how.autocast, self.scale)",
        "Replay(self.how.autocast, 1.0)",
    ),
    # ---- oracle: the true gradient and the per-micro-batch fit ------------------------------------------
    Mutant(
        "collinear gradients (one parameter) solved as a 2x2 system",
        OR,
        "    elif ps * ps >= (1.0 - 1e-9) * pp * ss:",
        "    elif False:",
    ),
    Mutant(
        "a fit's residual relative to |C|^2, not |C|",
        OR,
        "math.sqrt(max(r2, 0.0)) / math.sqrt(cc) if cc > 0",
        "math.sqrt(max(r2, 0.0)) / cc if cc > 0",
    ),
    Mutant(
        "later rescales of .grad not carried to earlier micro-batches' weights",
        OR,
        "            tail *= self.fits[j].beta\n",
        "",
    ),
    Mutant(
        "weights scaled by the group count, not the item count",
        OR,
        "w[j] = self.items * self.fits[j].a * tail",
        "w[j] = len(self.fits) * self.fits[j].a * tail",
    ),
    Mutant(
        "float16 replay at the loop's full scale (the summed loss overflows)",
        OR,
        "            how.scale / max(rows, 1)\n            if how.autocast",
        "            how.scale\n            if how.autocast",
    ),
    Mutant(
        "a large model's per-tensor gradient not unscaled",
        OR,
        "                if scale != 1.0:\n                    g = g / scale\n",
        "",
    ),
    Mutant(
        "a leak never seen: .grad at the window's start not checked",
        OR,
        "self.leak = any(g is not None and bool(g.any()) for g in grads)",
        "self.leak = False",
    ),
    Mutant(
        "the oracle's sum not emptied when a window opens",
        OR,
        "            else:\n                leaf.grad.zero_()\n            self._remember(i, g)",
        "            self._remember(i, g)",
    ),
    Mutant(
        "the oracle draws from the loop's random stream",
        OR,
        "        stack.enter_context(torch.random.fork_rng(devices=[]))\n",
        "",
    ),
    Mutant(
        "the oracle runs under the optimizer's no_grad",
        OR,
        "        stack.enter_context(torch.enable_grad())\n",
        "",
    ),
    Mutant(
        "the clip coefficient without torch's +1e-6",
        OR,
        "return min(1.0, max_norm / (norm_value + 1e-6))",
        "return min(1.0, max_norm / norm_value)",
    ),
    Mutant(
        "Gram matrix weights not applied", OR, "    return _weighted(out.cpu(), weights)", "    return out.cpu()"
    ),
    Mutant(
        "the float32 redo adds to the autocast replay instead of replacing it",
        OR,
        "        for leaf in self.leaves:\n            if leaf.grad is not None:\n                leaf.grad.zero_()\n        n, loss, _, _",
        "        n, loss, _, _",
    ),
    Mutant(
        "a chunked Gram matrix keeps only its first chunk's products",
        OR,
        "        acc += m @ m.T",
        "        acc += (m @ m.T) * (start == 0)",
    ),
    Mutant(
        "a chunk's scratch rows not refreshed past the first chunk",
        OR,
        "        for i, a in enumerate(rows):\n            scratch[i, :width].copy_",
        "        for i, a in enumerate(rows[:1]):\n            scratch[i, :width].copy_",
    ),
    Mutant(
        "finiteness read from the replay, not the loop's gradient",
        OR,
        "if dots is not None and not math.isfinite(float(dots[0, 0])):",
        "if dots is not None and not math.isfinite(float(dots[2, 2])):",
    ),
    Mutant(
        "sequences counted as items",
        OR,
        "            self.sequences + rows,\n",
        "            self.sequences + n,\n",
    ),
    Mutant(
        "the window's items counted as rows, not item losses",
        OR,
        "            self.items + n,\n            self.loss_sum + loss,",
        "            self.items + rows,\n            self.loss_sum + loss,",
    ),
    # ---- api: the run, the copy, coverage ---------------------------------------------------------------
    Mutant("the caller's model trained in place", A, "    net = copy_model(model)  #", "    net = model  #"),
    Mutant(
        "dropout switched off in the caller's model",
        A,
        "dropout = disable_dropout(net)",
        "dropout = disable_dropout(model)",
    ),
    Mutant(
        "verify's loader shuffles",
        A,
        "batch_size=batch_size, shuffle=False, drop_last=False",
        "batch_size=batch_size, shuffle=True, drop_last=False",
    ),
    Mutant(
        "verify's loader drops the last micro-batch",
        A,
        "batch_size=batch_size, shuffle=False, drop_last=False",
        "batch_size=batch_size, shuffle=False, drop_last=True",
    ),
    Mutant(
        "max_steps not forwarded to the recorder",
        A,
        "        item_losses,\n        max_steps,\n",
        "        item_losses,\n        None,\n",
    ),
    Mutant("a run ended by max_steps not said", A, "        stopped = True\n", "        stopped = False\n"),
    Mutant(
        "the loop's own error wrapped as verify's",
        A,
        "        if _raised_by_verify(err):",
        "        if True:",
    ),
    Mutant(
        "an optimizer instance over the caller's parameters accepted",
        A,
        "    if isinstance(optimizer, torch.optim.Optimizer):\n",
        "    if False:\n",
    ),
    Mutant(
        "items of different sizes without a collate_fn not refused up front",
        A,
        "    if collate_fn is None and not isinstance(dataset, IterableDataset):\n        _check_default_collate",
        "    if False:\n        _check_default_collate",
    ),
    Mutant(
        "batch_size 0 accepted",
        A,
        'check_int("batch_size", batch_size, low=1)',
        'check_int("batch_size", batch_size, low=0)',
    ),
    Mutant(
        "items drawn by a complete pass but never stepped counted as left out by design",
        CV,
        "        left = [i for i in left if i in passes.seen]  # the rest was drawn",
        "        pass  # the rest was drawn",
    ),
    Mutant(
        "a logged loss off by k only caught one way",
        DR,
        "return not close(r, 1.0) and (close(r * k, 1.0) or close(r / k, 1.0))",
        "return not close(r, 1.0) and close(r * k, 1.0)",
    ),
    Mutant(
        "the true loss leaves out what was forwarded after the last step",
        A,
        "(sum(s.loss_sum for s in steps) + cov.seen_loss) / true_items",
        "sum(s.loss_sum for s in steps) / true_items",
    ),
    Mutant(
        "the generic fix given for misscaled, not the cause's own",
        DR,
        '        if found:  # the fix of the cause found, not the generic one\n            fixes["misscaled"]',
        '        if False:  # the fix of the cause found, not the generic one\n            fixes["misscaled"]',
    ),
    Mutant(
        "the rows of an assumed clip not compared with the clipped truth",
        DR,
        "or ([assumed] if assumed else [])",
        "or []",
    ),
    Mutant(
        "coverage judged after data verify never handed out",
        A,
        '    if stopped or any(f.code == "untracked-data" for f in found):',
        "    if stopped:",
    ),
    Mutant(
        "the misscaled span's range collapsed to its first step",
        DR,
        '            f"c = {min(cs):.4f}" + (f" to {max(cs):.4f}" if max(cs) - min(cs) >= 5e-5 else "") if cs else ""\n',
        '            f"c = {cs[0]:.4f}" if cs else ""\n',
    ),
    Mutant(
        "the BatchNorm limit reported only for wrong steps",
        DR,
        "s.bn_gap is not None and (v.batchnorm_limit or v.codes)",
        "s.bn_gap is not None and v.codes",
    ),
    Mutant(
        "the global step hook left registered after the run",
        A,
        "        for h in hooks:\n            h.remove()\n",
        "        for h in hooks[:2]:\n            h.remove()\n",
    ),
    # ---- report: what the caller reads --------------------------------------------------------------------
    Mutant(
        "ok when any finding passes, not all",
        P,
        "return all(f.severity in PASSING for f in self.findings)",
        "return any(f.severity in PASSING for f in self.findings)",
    ),
    Mutant(
        "a limit outranks a bug in the status",
        P,
        'return "bug" if "bug" in kinds else "cannot-judge" if "limit" in kinds else "ok"',
        'return "cannot-judge" if "limit" in kinds else "bug" if "bug" in kinds else "ok"',
    ),
    Mutant(
        "cannot-judge exits like a bug",
        P,
        '"raised": 3, "cannot-judge": 4}',
        '"raised": 3, "cannot-judge": 1}',
    ),
    Mutant(
        "NaN written to JSON",
        P,
        "    return None if isinstance(v, float) and not math.isfinite(v) else v",
        "    return v",
    ),
    Mutant(
        "the clip column shown on every report",
        P,
        "clipped = any(s.clip < 1 for s in self.steps)",
        "clipped = True",
    ),
    Mutant(
        "the verdict line says OK for a limit",
        P,
        '        if self.status == "cannot-judge":',
        "        if False:",
    ),
    Mutant("HTML messages not escaped", P, '{html.escape(f.message)}"', '{f.message}"'),
    Mutant(
        "a finding's steps not printed",
        P,
        'steps = f" (steps {\', \'.join(map(str, self.steps))})" if self.steps else ""',
        'steps = ""',
    ),
    Mutant(
        "items of a stream shown as 0, not unknown",
        P,
        '        total = "?" if self.items_total is None else str(self.items_total)\n        lines.append',
        "        total = str(self.items_total or 0)\n        lines.append",
    ),
    Mutant(
        "a finding's severity left out of the JSON",
        P,
        '[asdict(f) | {"severity": f.severity} for f in self.findings]',
        "[asdict(f) for f in self.findings]",
    ),
    Mutant(
        "a cost finding fails the verdict",
        CO,
        'PASSING = ("note", "cost")',
        'PASSING = ("note",)',
        tests=RANKS,
    ),
    Mutant(
        "a sampler's duplicate items called a bug",
        CO,
        '    "duplicate-items": Code(\n        "note"',
        '    "duplicate-items": Code(\n        "bug"',
    ),
    Mutant(
        "an assumed clip called a bug",
        CO,
        '    "clip-assumed": Code(\n        "note"',
        '    "clip-assumed": Code(\n        "bug"',
    ),
    Mutant(
        "the loss the loop reported not printed",
        P,
        "        if self.logged_loss is not None and self.true_loss is not None:\n            lines.append",
        "        if False:\n            lines.append",
    ),
    # ---- copying: the caller's objects are never reached -----------------------------------------------
    Mutant(
        "instance-patched methods left pointing at the caller's model",
        C,
        "                copied[name] = _rebound(value, memo, done)",
        "                pass",
    ),
    Mutant(
        "hooks closing over the caller's model not rebuilt",
        C,
        'elif name.endswith("hooks") and isinstance(value, dict):',
        "elif False:",
    ),
    Mutant(
        "functions with defaults but no closure not rebuilt",
        C,
        "        if not obj.__closure__ and not obj.__defaults__ and not obj.__kwdefaults__:",
        "        if not obj.__closure__:",
    ),
    Mutant(
        "a partial's arguments not rebuilt", C, "*(_rebound(a, memo, done) for a in obj.args)", "*obj.args"
    ),
    Mutant(
        "a bound method's instance not rebuilt",
        C,
        "types.MethodType(_rebound(obj.__func__, memo, done), _rebound(obj.__self__, memo, done))",
        "types.MethodType(_rebound(obj.__func__, memo, done), obj.__self__)",
    ),
    Mutant(
        "only the top module's patched methods rebuilt",
        C,
        "    for m in model.modules():\n",
        "    for m in [model]:\n",
    ),
    Mutant(
        "a rebuilt function keeps the original's default arguments",
        C,
        "        out.__defaults__ = (\n            tuple(_rebound(d, memo, done) for d in obj.__defaults__) if obj.__defaults__ else None\n        )\n",
        "        out.__defaults__ = obj.__defaults__\n",
    ),
    Mutant(
        "closure cells copied as they were",
        C,
        "cell.cell_contents = _rebound(old.cell_contents, memo, done)",
        "cell.cell_contents = old.cell_contents",
    ),
    # ---- shadow, sources, patches ----------------------------------------------------------------------------
    Mutant(
        "the shadow's leaves always require grad",
        SH,
        "return torch.nn.Parameter(p.detach(), requires_grad=p.requires_grad)",
        "return torch.nn.Parameter(p.detach(), requires_grad=True)",
        equivalent="sync_shadow, run when the Recorder is built and at every window's first forward, sets each "
        "kept leaf's requires_grad from the loop's parameter, and _close_group sets it again before every "
        "replay, so no gradient, weight or verdict changes; the one trace is a zero .grad buffer opened "
        "for a frozen parameter the loop replaced (cast or moved) before a window opened: memory only",
    ),
    Mutant("the shadow keeps its own train/eval mode", SH, "        s.training = m.training\n", ""),
    Mutant(
        "a sweep over the dataset by iteration counted as micro-batch reads",
        S,
        "            if i > 0 and self.pending[-i:] == list(range(i)):",
        "            if False:",
    ),
    Mutant(
        "a worker of the loop's own loader not refused",
        S,
        "    def __getitem__(self, i: int) -> Any:\n        if get_worker_info() is not None:",
        "    def __getitem__(self, i: int) -> Any:\n        if False:",
    ),
    Mutant(
        "a batch sampler's drop_last not read",
        S,
        'drop = getattr(loader, "drop_last", False) or getattr(batches, "drop_last", False)',
        'drop = getattr(loader, "drop_last", False)',
    ),
    Mutant(
        "a pass without a length ends only past the dataset's size (its short tail read as early-step)",
        S,
        "else self.items >= self.held",
        "else self.items > self.held",
    ),
    Mutant(
        "a pass ends only once every item was drawn, whatever the loader's length",
        S,
        "end = self.drawn == self.batches if self.batches is not None else self.items >= self.held",
        "end = self.items >= self.held",
    ),
    Mutant(
        "repeated draws in a pass counted once too many",
        S,
        "self.duplicates += sum(c - 1 for c in self.counts.values())",
        "self.duplicates += sum(c for c in self.counts.values())",
    ),
    Mutant(
        "another model's clip recorded as this model's",
        PA,
        "if any(id(p) in rec.param_ids for p in params):",
        "if True:",
    ),
    Mutant(
        "a step GradScaler skipped merged into the next window",
        PA,
        "        if (\n            len(rec.steps) == before\n            and rec.window\n",
        "        if (\n            False\n            and rec.window\n",
    ),
    Mutant(
        "DataLoader iteration left patched after the run",
        PA,
        "        DataLoader.__iter__ = original  # type: ignore[method-assign]\n",
        "",
    ),
    Mutant(
        "GradScaler left patched after the run",
        PA,
        "        torch.amp.GradScaler.step, torch.amp.GradScaler.scale = step, scale  # type: ignore[method-assign]\n",
        "        pass\n",
    ),
    Mutant(
        "a scheduler stepped between windows flagged",
        PA,
        "if ours and rec.window and lrs(opt) != before:",
        "if ours and lrs(opt) != before:",
    ),
    # ---- job and ranks: a multi-rank job (the ranks test: one launch) ---------------------------------------
    Mutant(
        "uneven steps across ranks not reported",
        J,
        "    if len(set(counts)) > 1:\n",
        "    if False:\n",
        tests=RANKS,
    ),
    Mutant(
        "padding repeats across ranks not counted",
        J,
        "repeated = sum(c - 1 for counter in per_pass.values() for c in counter.values())",
        "repeated = 0",
        tests=RANKS,
    ),
    Mutant(
        "the job's sum not all-reduced (each rank's own oracle)",
        RK,
        "        dist.all_reduce(self._flat(sums, like))  # the job's sum,",
        "        self._flat(sums, like)  # the job's sum,",
        tests=RANKS,
    ),
    Mutant(
        "a rank's engine that cannot vouch for its run not heard by the others (the job stays in place)",
        RK,
        "        if said:\n",
        "        if False:\n",
        tests=RANKS,
    ),
    Mutant(
        "ranks taken as holding the same gradient and parameters without comparing their checksums",
        RK,
        'if every[0]["same"] is None or any(e["same"] != every[0]["same"] for e in every):',
        'if every[0]["same"] is None:',
        tests=RANKS,
    ),
    Mutant(
        "the ranks' oracles said as rank 0's alone",
        A,
        "    if len(set(oracles)) > 1:",
        "    if False:",
        tests=RANKS,
    ),
    # ---- cli -------------------------------------------------------------------------------------------------
    Mutant(
        "the command line exits 0 whatever the verdict",
        CLI,
        "    return report.exit_status\n",
        "    return 0\n",
    ),
    Mutant(
        "--accum-steps ignored when the file sets ACCUM_STEPS",
        CLI,
        '        kw["accum_steps"] = args.accum_steps if args.accum_steps is not None else kw["accum_steps"]\n        kw["batch_size"] = args.batch_size if args.batch_size is not None else kw["batch_size"]\n        for flag',
        '        kw["accum_steps"] = kw["accum_steps"] or args.accum_steps\n        kw["batch_size"] = args.batch_size if args.batch_size is not None else kw["batch_size"]\n        for flag',
    ),
    # ---- tolerances: each loosened 10x (or tightened where a tight value fails correct loops) --------------
    Mutant("FLOAT32_RTOL loosened 10x", T, "FLOAT32_RTOL = 1e-4", "FLOAT32_RTOL = 1e-3"),
    Mutant("AUTOCAST_RTOL loosened 10x", T, "AUTOCAST_RTOL = 1e-2", "AUTOCAST_RTOL = 1e-1"),
    Mutant("FIT_RTOL loosened 10x", T, "FIT_RTOL = 1e-3", "FIT_RTOL = 1e-2"),
    Mutant("SAME_FACTOR_RTOL loosened 10x", T, "SAME_FACTOR_RTOL = 1e-2", "SAME_FACTOR_RTOL = 1e-1"),
    Mutant("COEF_RTOL loosened 10x", T, "COEF_RTOL = 0.05", "COEF_RTOL = 0.5"),
    Mutant("SCALED_CLIP_RATIO loosened 10x", T, "SCALED_CLIP_RATIO = 1.5", "SCALED_CLIP_RATIO = 15"),
    Mutant("CLIP_NORM_RTOL loosened 10x", T, "CLIP_NORM_RTOL = 1e-3", "CLIP_NORM_RTOL = 1e-2"),
    Mutant("LOGGED_RTOL loosened 10x", T, "LOGGED_RTOL = 0.1", "LOGGED_RTOL = 1.0"),
    Mutant(
        "BF16_RTOL tightened 10x (bf16 figures read as float32 ones)",
        T,
        "BF16_RTOL = 1e-1",
        "BF16_RTOL = 1e-2",
    ),
]
