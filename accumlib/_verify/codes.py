"""The one table of finding codes: name, kind, message and fix.

Kinds: ``bug`` (the loop is wrong), ``limit`` (no loop can match the oracle here, or verify
could not judge), ``note`` (said for the record; the loop may well be right), ``cost`` (the
gradient is right but the run pays for it: time or traffic it need not spend). ``Report.ok``
is False when any finding is a bug or a limit. Messages are ``str.format`` templates; the
report fills them from the run's numbers (``Finding.of``), and nothing else writes a finding's text.
``said`` holds the other ways a finding of the code is worded where a run knows more (a count, a
norm, the steps a clip masked), each a template of its own that may quote ``{message}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["bug", "limit", "note", "cost"]  # the kinds of KINDS, as a type


@dataclass(frozen=True)
class Code:
    kind: Kind
    message: str
    fix: str
    said: Mapping[str, str] = field(default_factory=dict)  # form -> template (``Finding.of(code, form=...)``)
    # the call in the user's code a finding of this code points at (file:line, ``sites.py``): "step",
    # "backward", "clip" or "scheduler"; "" for a finding about the run, not one call
    at: Literal["", "step", "backward", "clip", "scheduler"] = ""
    # what the code means, in one line: the docs' table of codes (docs/verify.md) is made of these
    # (tools/codes_table.py writes it, tests/test_readme.py checks it is the table's own)
    meaning: str = ""

    @property
    def passing(self) -> bool:
        """A finding of this code leaves a verdict ok: a note or a cost, not a bug (``PASSING``)."""
        return self.kind in PASSING


CODES: dict[str, Code] = {
    "unscaled-sum": Code(
        "bug",
        "the step's gradient is the sum of its m micro-batch means, about m x the true gradient: the loss "
        "was never divided",
        "divide each micro-batch's loss so the window's items weigh 1/N each: (losses.sum() / "
        "n_items_in_window).backward()",
        at="backward",
        meaning="gradient ≈ m × the true one (m micro-batches): the loss was never divided",
    ),
    "mean-of-means": Code(
        "bug",
        "micro-batches with different item counts were weighted per micro-batch, not per item",
        "weigh items, not micro-batches: count the window's items N first, then backward losses.sum() / N",
        at="backward",
        meaning="micro-batches with different item counts weighted per micro-batch, not per item",
    ),
    "misscaled": Code(
        "bug",
        "at each of these steps every micro-batch's share of the gradient is scaled by one factor c != 1 "
        "(the c column gives each step's)",
        "divide the window's summed item losses by exactly the number of items item_losses counts (N), "
        "nothing else",
        said={
            # a detail: the update equals the correct one at these steps, though the gradient was off
            "masked": "masked by clipping at step(s) {at}: clip_grad_norm_ cut both the loop's gradient and "
            "the "
            "true one to max_norm, so the update there equals the correct one; the bug is real and shows at "
            "any "
            "step where the clip does not act"
        },
        at="backward",
        meaning=(
            "at a step, every micro-batch's share scaled by one factor c ≠ 1; c is reported per step, "
            "and named when it matches a known cause (c = N/(N+S): labels counted before a causal LM's "
            "shift; N/(N−S): PEFT's virtual tokens; N/D with one constant D for the run; 1/R and R "
            "across R ranks; 1/k; k; m/k; 1/m; 1/b; a whole-number reduction), and said to be *masked* "
            "where a clip hid it from the update"
        ),
    ),
    "tail-dropped": Code(
        "bug",
        "items reached no optimizer step",
        "step the last, partial window too (`if (i + 1) % k == 0 or i + 1 == len(loader)`), dividing it by "
        "its own item "
        "count, not by k (accumlib.ragged does both)",
        said={
            "count": "{n} of {total} items reached no optimizer step",
            # accumlib run / watch: a pass over a DataLoader left unfinished for the next one
            "passes": "{n} micro-batches were never drawn: the loop began its next pass over the data (of "
            "{total} micro-batches) before it finished the one before",
            "never": "the loop never called optimizer.step(); {n} of {total} items reached no optimizer step",
            "job": "{n} of {total} items reached no optimizer step on any rank",
            "job-never": "the job never called optimizer.step(); {n} of {total} items reached no optimizer "
            "step "
            "on any rank",
            # an IterableDataset: no length, so no total
            "job-stream": "{n} items reached no optimizer step on any rank",
            "job-stream-never": "the job never called optimizer.step(); {n} items reached no optimizer step "
            "on "
            "any rank",
        },
        meaning=(
            "items that reached no optimizer step, counted per pass: the last epoch's unstepped window "
            "is named even where an earlier epoch stepped the same items"
        ),
    ),
    "tail-misscaled": Code(
        "bug",
        "the last, partial window was divided as if it held all {k} micro-batches",
        "divide the last window by its own item count, not by k micro-batches' worth",
        at="backward",
        meaning="the last, partial window divided as if it were full",
    ),
    "zero-grad-inside-window": Code(
        "bug",
        "earlier micro-batches of a window (almost) never reached the step: .grad was zeroed, or shrunk "
        "again "
        "(divided inside the loop), between micro-batches of one window",
        "call optimizer.zero_grad() only right after optimizer.step(), and divide .grad (if at all) once, "
        "after the last micro-batch",
        at="backward",
        meaning="gradients zeroed (or shrunk) between micro-batches of one window",
    ),
    "no-zero-grad": Code(
        "bug",
        "gradients of an earlier window leaked into this step: .grad was not zeroed after the previous step",
        "call optimizer.zero_grad(set_to_none=True) after every optimizer.step()",
        at="step",
        meaning="gradients of an earlier window leak into a later step",
    ),
    "early-step": Code(
        "bug",
        "the optimizer stepped more often than every {k} micro-batches",
        "step once per window: when (i + 1) % accum_steps == 0 or at the last micro-batch",
        at="step",
        meaning="the optimizer steps more often than every `accum_steps` micro-batches",
    ),
    "late-step": Code(
        "bug",
        "the optimizer stepped less often than every {k} micro-batches: a step averaged more micro-batches "
        "than accum_steps = {k}, so its effective batch is larger than the one asked for",
        "step once per window of accum_steps micro-batches, with the accum_steps asked for (not a larger k, "
        "not once per epoch): when (i + 1) % accum_steps == 0 or at the last micro-batch",
        at="step",
        meaning=(
            "the optimizer steps less often than every `accum_steps` micro-batches (a larger k, one "
            "step per epoch, a tail merged into the last window): a step averages more micro-batches "
            "than asked, so its effective batch is larger, even where its gradient is exactly that "
            "window's large batch"
        ),
    ),
    "scheduler-per-micro-batch": Code(
        "bug",
        "the learning rate changed between micro-batches of one window (a scheduler stepped per micro-batch)",
        "call scheduler.step() next to optimizer.step(), once per window",
        at="scheduler",
        meaning="the learning rate changes between micro-batches of one window",
    ),
    "frozen-inside-window": Code(
        "bug",
        "a parameter was frozen or unfrozen (requires_grad) between micro-batches of one window, so its "
        "gradient "
        "covers only part of the window's items while the rest of the model's covers all of them",
        "change requires_grad only between optimizer steps (right after optimizer.zero_grad()), never inside "
        "a window",
        at="backward",
        meaning=(
            "a parameter frozen or unfrozen between micro-batches of one window: its gradient covers "
            "part of the window"
        ),
    ),
    "clip-per-micro-batch": Code(
        "bug",
        "gradients were clipped before the window's gradient was complete",
        "clip once, after the window's last backward and right before optimizer.step()",
        at="clip",
        meaning="clipping before the window's gradient is complete",
    ),
    "clip-before-unscale": Code(
        "bug",
        "clipping ran on GradScaler-scaled gradients, so it clipped (almost) everything",
        "call scaler.unscale_(optimizer) before clip_grad_norm_",
        at="clip",
        meaning="clipping applied to GradScaler-scaled gradients",
    ),
    "scale-changed-inside-window": Code(
        "bug",
        "GradScaler's scale changed between the window's backwards, while unscale_ divides the summed "
        "gradient by one scale: each micro-batch weighs its own scale over that one",
        "call scaler.update() once per optimizer step, after scaler.step(optimizer), never between the "
        "window's backwards",
        at="backward",
        meaning="GradScaler's scale changed inside a window (scaler.update() between backwards)",
    ),
    "logged-loss-scaled": Code(
        "bug",
        "the loss the loop reports is off by about {k} = accum_steps",
        "log the undivided loss (or multiply back by the divisor) when reporting",
        said={
            "epoch": "the loop reports a loss of {logged:.4g}, but the true mean item loss is {true:.4g} "
            "(off by about {k} = accum_steps)"
        },
        meaning="the loss the loop reports is off by the accumulation factor",
    ),
    "unexplained": Code(
        "bug",
        "the step's gradient differs from the true large-batch gradient in a way no known bug explains",
        "first check that item_losses computes the loop's own loss (same reduction, masking, label shift, "
        "extra terms); "
        "then compare the loop with accumlib.ragged line by line",
        at="backward",
        meaning=(
            "a wrong gradient no known bug explains; the report gives the fitted per-micro-batch "
            "weights, the norm ratio and the cosine, and asks whether `item_losses` is the loop's own "
            "loss"
        ),
    ),
    "non-finite": Code(
        "bug",
        "the gradient the optimizer saw holds inf or nan",
        "lower the learning rate or check the data; with GradScaler, make sure it can skip steps",
        at="backward",
        meaning="inf or nan in the gradient",
    ),
    "no-items": Code(
        "bug",
        "the optimizer stepped on a window with no items",
        "make sure every window holds at least one item the loss counts",
        meaning="a step over no items",
    ),
    "per-rank-mean": Code(
        "bug",
        "each rank divided its window's loss by its own item count N_r, so the job's gradient is the mean of "
        "the "
        "ranks' means, G = (1/R) sum_r O_r / N_r: the items of a rank holding fewer weigh more",
        "count the window's items on every rank and all-reduce the count (N = sum_r N_r); backward "
        "losses.sum() * R / N "
        "under DDP's average (with a transformers Trainer: average_tokens_across_devices=True)",
        at="backward",
        meaning=(
            "a multi-rank job: each rank divided by its own item count N_r, so ranks with fewer items "
            "weigh more (G = (1/R) Σ_r O_r / N_r, fitted exactly)"
        ),
    ),
    "ranks-diverged": Code(
        "bug",
        "the ranks applied different gradients, or held different parameters, at these steps: the gradient "
        "was "
        "never synchronized across ranks",
        "let the window's last backward synchronize: run it outside model.no_sync() (DDP), or with "
        "set_requires_gradient_sync(True) (FSDP2)",
        meaning=(
            "the ranks applied different gradients or held different parameters at a step (`no_sync` "
            "around every micro-batch)"
        ),
    ),
    "unsharded-data": Code(
        "bug",
        "every rank drew the same dataset items, so R ranks did the work of one: the job's large batch is R "
        "copies "
        "of one rank's window",
        "give each rank its own shard: DataLoader(loader.dataset, "
        "sampler=DistributedSampler(loader.dataset), ...)",
        said={"draws": "{message} ({draws} draws on each of {ranks} ranks)"},
        meaning="every rank drew the same dataset items (no `DistributedSampler`)",
    ),
    "uneven-steps": Code(
        "bug",
        "the ranks stepped a different number of times: steps some ranks took alone were judged on "
        "their own rank only",
        "give every rank the same number of micro-batches (DistributedSampler pads to equal length; with "
        "drop_last, "
        "all ranks drop alike), and step on the same micro-batch everywhere",
        said={"per-rank": "{message} (steps per rank {counts})"},
        meaning=(
            "the ranks stepped a different number of times; steps a rank took alone are judged on that "
            "rank only"
        ),
    ),
    "sync-every-micro-batch": Code(
        "cost",
        "the gradient was synchronized across ranks after every micro-batch, not once per window: "
        "the result is right, but it pays k all-reduces per step where one would do",
        "run the window's other backwards inside model.no_sync() (DDP; the forward as well: DDP decides at "
        "the "
        "forward), or set_requires_gradient_sync(False) (FSDP2); a Trainer and Accelerate's accumulate() do "
        "this",
        said={"count": "{message} ({syncs} syncs in a window of {m} micro-batches)"},
        meaning=(
            "DDP synchronized the gradient after every micro-batch of a window: right, but k "
            "all-reduces where one does"
        ),
    ),
    "sharded-model": Code(
        "note",
        "the model is sharded (FSDP2 fully_shard): to judge it, verify's oracle holds a whole copy of the "
        "parameters "
        "on every rank and gathers each gradient whole at every step ({mib:.3g} MiB per rank, plus one "
        "gradient-sized buffer)",
        "nothing to fix; on a model too large to hold whole on one device, verify a smaller configuration of "
        "it",
        meaning=(
            "FSDP2: verify's oracle holds a whole copy of the parameters per rank and gathers each "
            "gradient whole (the size is reported)"
        ),
    ),
    "batchnorm": Code(
        "limit",
        "the model holds BatchNorm: per-micro-batch statistics differ from the large batch's, so no loop can "
        "match it",
        "replace BatchNorm with GroupNorm or LayerNorm, or accept per-micro-batch statistics",
        said={
            "gap": "{message}; a correct accumulation is off by up to {worst:.2e} (relative) from the merged "
            "window's gradient, and the verdicts were judged against the micro-batch accumulation instead"
        },
        meaning="BatchNorm cannot match the large batch; the size is reported, GroupNorm suggested",
    ),
    "untracked-data": Code(
        "limit",
        "the loop's forwards ran on data that did not come from the loader verify handed it, so those steps "
        "could not be judged",
        "iterate the `loader` argument (or a DataLoader over loader.dataset with loader.collate_fn) inside "
        "train_fn",
        meaning="the loop's forwards ran on data that did not come from the loader verify handed it",
    ),
    "loader-left-out": Code(
        "note",
        "the loop's DataLoader handed out fewer items than the dataset holds, by its own design ({why}): "
        "{n} dataset item(s) left out over {passes} pass(es) ({per} of {held} per pass), so no step could "
        "use them; "
        "every step was judged on the items it drew",
        "nothing to fix if dropping them is intended; with drop_last=False (the default) the last, partial "
        "micro-batch is drawn and must be stepped, divided by its own item count",
        meaning=(
            "a complete pass of the loop's loader drew fewer items than the dataset holds "
            "(`drop_last=True`, a subset sampler): counted per pass, not blamed on the loop"
        ),
    ),
    "duplicate-items": Code(
        "note",
        "{n} draw(s) repeated a dataset item already drawn in the same pass (a sampler with replacement, or "
        "padding): each copy weighs as one item, in the loop and in the large batch it is judged against",
        "nothing to fix if the sampler repeats items on purpose; a DistributedSampler pads ranks this way "
        "(with "
        "drop_last=False it repeats up to R-1 items per pass so every rank holds as many)",
        said={"job": "{message} (counted over every rank's draws)"},
        meaning=(
            "a sampler drew an item twice in one pass (replacement; across ranks, a "
            "`DistributedSampler`'s padding); each draw weighs as one item, in the loop and in the "
            "oracle"
        ),
    ),
    "dropout": Code(
        "note",
        "dropout layers were set to p=0 in verify's copy, so every step is compared exactly; the verdict "
        "concerns "
        "accumulation alone, not dropout noise",
        "nothing to fix for accumulation; dropout masks are random in any loop",
        said={
            "layers": "{layers} dropout layer(s) (p={ps}): {message}",
            # accumlib.hf: float probabilities of a model's config (attention dropout, LayerDrop)
            "randomness": "random training-mode probabilities ({names}) were set to 0 in verify's copy, so "
            "every step is compared exactly",
            "randomness-too": "random training-mode probabilities ({names}) were set to 0 too",
        },
        meaning="dropout is switched off in verify's copy so the comparison is exact",
    ),
    "clip-assumed": Code(
        "note",
        "torch clipped nothing (no clip_grad_norm_ or clip_grads_with_norm_, by any name), but the scaled "
        "steps all end at one norm: verify assumes the loop clips with a function of its own and compares "
        "those steps with the oracle clipped to that norm",
        "nothing to fix if the loop clips on purpose; clip with torch's clip_grad_norm_ (any import style) "
        "to have it checked, not assumed",
        said={"norm": "{message} (max_norm ~= {max_norm:.4g})"},
        meaning=(
            "torch clipped nothing (by any name), but two or more steps were shrunk to one norm and "
            "nothing contradicts a clip there: a clip of the loop's own (fairseq, DeepSpeed) is "
            "assumed, and said"
        ),
    ),
    "partial-run": Code(
        "note",
        "verify judged the first {n} optimizer steps and then ended the loop (max_steps); the rest of the "
        "run "
        "(its last window, items never stepped, the epoch loss) was not judged",
        "nothing to fix; run without max_steps to judge the whole run",
        said={
            # an iteration-based loop (nanoGPT's): a number of steps, not passes, so no tail to step
            "mid-pass": "the loop ended inside its first pass over the data, {n} of its {held} items never "
            "drawn, as an iteration-based loop does (a number of steps, not passes): those items were not "
            "counted as dropped; every item it forwarded was judged"
        },
        meaning=(
            "`max_steps` ended the loop, the rest was not judged; or an iteration-based loop "
            "(nanoGPT's) ended inside its first pass, and the items it never drew were not counted as "
            "dropped"
        ),
    ),
    # accumlib run / accumlib.watch (``inplace.py``): what the in-place engine cannot see is said
    "no-step": Code(
        "limit",
        "the run took no optimizer step: there is no step to judge (its backwards, if any, reached none)",
        "let the script take at least one optimizer step (a larger max_iters, more data), then run it again",
        meaning=(
            "`accumlib run` / `watch`: the run took no optimizer step after a backward, so there is no "
            "step to judge"
        ),
    ),
    "unseen-loss": Code(
        "limit",
        "a backward reached the parameters other than through one standard loss call with equal weights on "
        "its items (a loss of the script's own, a none-reduction weighted per item, a gradient made by "
        "torch.autograd.grad), so its items are unknown and its steps could not be judged",
        "compute the loss with torch.nn.functional's losses (mask with ignore_index, reduce with "
        "reduction='sum' or 'mean'), or name the script's own per-item loss function with --item-losses "
        "MODULE:FUNCTION (accumlib.watch(item_losses=...))",
        at="backward",
        meaning=(
            "`accumlib run` / `watch`: a backward reached the parameters other than through a loss call "
            "it knows with equal weights on its items (a loss of the script's own not named by "
            "`--item-losses`, per-item weights); those steps are not judged"
        ),
    ),
    "compiled-loss": Code(
        "limit",
        "the loss was computed inside a torch.compile'd function, whose backward is one compiled node: the "
        "loss calls inside it never run as calls accumlib can see, so its items are unknown and its steps "
        "were not judged",
        "compile the model without its loss (return the logits, compute the loss outside the compiled "
        "function: a compiled model is judged that way), or run with compilation off to judge the loop",
        at="backward",
        meaning=(
            "`accumlib run` / `watch`: the loss was computed inside a `torch.compile`d function, whose "
            "loss calls accumlib cannot see; a compiled model whose loss is computed outside it is "
            "judged"
        ),
    ),
    "several-losses": Code(
        "limit",
        "this run adds {n} loss terms per micro-batch: {sites}; how they combine into one item's loss is the "
        "script's choice, which accumlib does not guess",
        "pass --item-losses MODULE:FUNCTION (accumlib.watch(item_losses=...)): a function of the script that "
        "returns each item's combined loss, one per item, which the script calls and then reduces",
        meaning=(
            "`accumlib run` / `watch`: one backward added several loss terms (standard loss calls made "
            "at different places, or one and a term of the script's own), each named; how they combine "
            "is not guessed: `accumlib run` exits 2 and asks for `--item-losses`"
        ),
    ),
    "item-losses-unused": Code(
        "note",
        "item_losses {name} was given, but the run never called it where accumlib replaced it (the script "
        "calls it through another name, or not at all): its steps were judged from its standard loss calls",
        "name the function where the script looks it up when it calls it (MODULE:FUNCTION of that module), "
        "or leave item_losses out",
        meaning=(
            "`accumlib run` / `watch`: the `item_losses` function named was never called where accumlib "
            "replaced it; the steps were judged from the run's standard loss calls"
        ),
    ),
    "several-optimizers": Code(
        "limit",
        "several optimizers stepped in a way that does not say whose gradient is whose ({sites}): a step "
        "whose window holds backwards that never reached its parameters (two optimizers' windows "
        "interleaved), a parameter held by two optimizers, or a clip over both and another clip; each "
        "optimizer over its own parameters and its own window (a GAN's two halves) is judged",
        "give each optimizer its own window (its backwards, then its step; then the other's), or judge each "
        "half with accumlib.verify(train_fn, item_losses=...) on its own",
        meaning=(
            "`accumlib run` / `watch`: optimizers that step in a way that does not say whose gradient "
            "is whose (windows interleaved, a parameter held by two); each optimizer over its own "
            "parameters and window, a GAN's two halves, is judged"
        ),
    ),
    "grad-hook": Code(
        "limit",
        "a function hooked on a gradient inside the graph ({sites}) can change what reaches the parameters, "
        "in the optimizer's gradient and in the in-place engine's sum alike, so these steps were not judged",
        "run without the hook to judge the accumulation, or judge the loop with accumlib.verify(train_fn, "
        "item_losses=...), which computes the true gradient from item_losses on a copy",
        meaning=(
            "`accumlib run` / `watch`: a function hooked on a gradient inside the graph (a tensor's or "
            "a module's) can change what reaches the parameters, in the optimizer's gradient and the "
            "engine's sum alike; its steps are not judged"
        ),
    ),
    "params-changed-inside-window": Code(
        "limit",
        "the parameters changed between the window's first loss call and its step, other than by the "
        "optimizer ({sites}): an edit through .data or under torch.no_grad, which autograd does not see, so "
        "the window's micro-batches may have been differentiated at different parameters; these steps were "
        "not judged",
        "edit the parameters after opt.step() (before the next window's first forward), never inside a "
        "window, or judge the loop with accumlib.verify(train_fn, item_losses=...), which "
        "replays each window at the parameters it started from",
        at="step",
        meaning=(
            "`accumlib run` / `watch`: the parameters changed inside a window (through `.data` or under "
            "`torch.no_grad`), read from their checksum as the window opened and at its step; its steps are "
            "not judged"
        ),
    ),
    "multi-rank": Code(
        "limit",
        "the run is one rank of a multi-process job whose parameters are sharded ({sites}): each rank holds "
        "a shard of the gradient, which the in-place engine does not gather, so its steps were not judged",
        "run the script on one process, or with DDP (replicated parameters) to judge it in place, or judge "
        "the job's loop with accumlib.verify(..., ranks='all') on every rank",
        meaning=(
            "`accumlib run` / `watch`: one rank of a job whose parameters are sharded (FSDP2); its "
            "shard of the gradient is not the job's, so its steps are not judged"
        ),
    ),
}

KINDS: tuple[Kind, ...] = ("bug", "limit", "note", "cost")
PASSING: tuple[Kind, ...] = ("note", "cost")  # kinds that leave a verdict ok

__all__ = ["CODES", "KINDS", "PASSING", "Code"]
