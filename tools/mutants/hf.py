"""Mutants of accumlib/hf/: verify_trainer (trainer.py), the item losses (losses.py), the TRL rules (trl.py).

tiny.py builds the offline tokenizer, models and texts the tests run on; it decides no verdict, so it
has no mutants here (a change there changes the fixtures, not what verify_trainer says about them).
"""

from mutate import Mutant

TESTS = ["tests/test_hf.py", "tests/test_hf_trainer_settings.py", "tests/test_hf_losses.py"]
TRL = ("tests/test_verify_trl.py",)  # the TRL rules only matter on a TRL trainer
# virtual tokens only matter on a PEFT adapter
PEFT = ("tests/test_verify_peft.py", "tests/test_hf_losses.py")

T, L, R = "accumlib/hf/trainer.py", "accumlib/hf/losses.py", "accumlib/hf/trl.py"
PREPARED = (
    "the copy's train_dataset is replaced by verify's recording wrapper around the user's (already prepared) "
    "dataset before any batch is drawn, so whatever TRL prepares in the copy is discarded: preparing again costs "
    "time only (TRL 1.16 sees input_ids and skips tokenising; truncating or packing packed rows changes nothing). "
    "Measured under this mutant: the copy's micro-batches equal the user's own train() in the plain, "
    "completion-only, packing and padding-free SFT variants"
)
MUTANTS = [
    # --- trainer.py: the user's objects, copied not used ------------------------------------------
    Mutant(
        "the user's optimizer state is not copied (momentum buffers start empty)",
        T,
        "        opt.load_state_dict(copy.deepcopy(user_opt.state_dict()))\n",
        "",
    ),
    Mutant(
        "the user's optimizer state is shared, not deep-copied (the copy moves the user's momentum)",
        T,
        "opt.load_state_dict(copy.deepcopy(user_opt.state_dict()))",
        "opt.load_state_dict(user_opt.state_dict())",
    ),
    Mutant(
        "the user's parameter-group hyperparameters are dropped (every group gets the defaults)",
        T,
        '                **{k: v for k, v in g.items() if k != "params"},\n',
        "",
        equivalent="the next lines load the user's state_dict into the rebuilt optimizer, and torch's "
        "Optimizer.load_state_dict takes every saved group's hyperparameters (keeping only its params): "
        "the groups' settings before it cannot show (the twin-run test sees lr 0.1 and weight decay either way)",
    ),
    Mutant(
        "an optimizer over parameters of another model is not refused",
        T,
        "    if foreign:\n        raise ValueError",
        "    if False:\n        raise ValueError",
    ),
    Mutant(
        "the user's scheduler is not copied (the Trainer builds its own)",
        T,
        "optimizers=(opt, _copied_scheduler(user_sched, user_opt, opt))",
        "optimizers=(opt, None)",
    ),
    Mutant(
        "the scheduler's copy still drives a copy of the user's optimizer, not verify's",
        T,
        "sched = copy.deepcopy(user_sched, memo={id(user_opt): opt})",
        "sched = copy.deepcopy(user_sched)",
    ),
    Mutant(
        "the user's stateful callbacks are passed as they are, not copied",
        T,
        "        copy.deepcopy(cb)\n        for cb in",
        "        cb\n        for cb in",
    ),
    Mutant(
        "the user's callbacks are left out of the copy",
        T,
        "                callbacks=_copied_callbacks(trainer),\n",
        "                callbacks=None,\n",
    ),
    Mutant(
        "the user's compute_loss_func is not forwarded",
        T,
        'compute_loss_func=getattr(trainer, "compute_loss_func", None),',
        "compute_loss_func=None,",
    ),
    Mutant(
        "the user's optimizer_cls_and_kwargs is not forwarded",
        T,
        'optimizer_cls_and_kwargs=getattr(trainer, "optimizer_cls_and_kwargs", None),',
        "optimizer_cls_and_kwargs=None,",
    ),
    Mutant(
        "the user's item_losses is ignored for the default",
        T,
        "losses = item_losses or default_item_losses(",
        "losses = default_item_losses(",
    ),
    Mutant(
        "label_smoothing_factor is not passed to the default item losses",
        T,
        "default_item_losses(model, args.label_smoothing_factor)",
        "default_item_losses(model)",
    ),
    # --- trainer.py: the training arguments of the copy ---------------------------------------------
    Mutant(
        "the user's num_train_epochs is kept (every epoch judged, not one)",
        T,
        '        changes["num_train_epochs"] = 1  # every window of a pass is judged in the first pass\n',
        "        pass\n",
    ),
    Mutant(
        "the user's TrainingArguments are changed in place",
        T,
        "    return dataclasses.replace(args, **{k: v for k, v in changes.items() if k in fields})",
        "    for k, v in changes.items():\n        if k in fields:\n            setattr(args, k, v)\n    return args",
    ),
    Mutant(
        "args.max_steps and max_steps= combined with max (the larger), not min",
        T,
        "    cap = min(\n",
        "    cap = max(\n",
    ),
    Mutant(
        "args.max_steps is not a cap (only max_steps= counts)",
        T,
        "for n in (max_steps, args.max_steps if args.max_steps and args.max_steps > 0 else None) if n]",
        "for n in (max_steps,) if n]",
    ),
    Mutant(
        "dataloader workers kept in the copy",
        T,
        "dataloader_num_workers=0,",
        "dataloader_num_workers=args.dataloader_num_workers,",
    ),
    Mutant(
        "NEFTune noise kept in the copy",
        T,
        "neftune_noise_alpha=None,",
        "neftune_noise_alpha=args.neftune_noise_alpha,",
    ),
    Mutant("evaluation kept in the copy", T, 'eval_strategy="no",', "eval_strategy=args.eval_strategy,"),
    Mutant(
        "the copy writes to the user's output_dir",
        T,
        "        output_dir=output_dir,\n        report_to=[],",
        "        output_dir=args.output_dir,\n        report_to=[],",
    ),
    Mutant(
        "the copy's Trainer prints its end-of-training metrics",
        T,
        "            copy_of.remove_callback(PrinterCallback)",
        "            pass",
    ),
    Mutant(
        "a length-grouped sampler reads lengths through verify's recording dataset",
        T,
        "sampler(\n                _as_sampled(copy_of, trainer.train_dataset)\n            )",
        "sampler(dataset)",
    ),
    Mutant(
        "a length-grouped sampler reads a datasets.Dataset's length column the Trainer removes",
        T,
        '        copy_of._remove_unused_columns(dataset, description="Training")\n        if',
        "        dataset\n        if",
    ),
    # --- trainer.py: refusals before any work --------------------------------------------------------
    Mutant("n_gpu > 1 (DataParallel) is not refused", T, "if args.n_gpu > 1:", "if args.n_gpu > 8:"),
    Mutant("FSDP args are not refused", T, '            ("fsdp", args.fsdp),\n', ""),
    Mutant(
        "a Trainer without a train_dataset is not refused by name",
        T,
        "if trainer.train_dataset is None:",
        "if False:",
    ),
    Mutant(
        "max_steps=0 is accepted",
        T,
        'check_int("max_steps", max_steps, low=1, optional=True)',
        'check_int("max_steps", max_steps, low=0, optional=True)',
    ),
    # --- trainer.py: the user's process state and randomness -----------------------------------------
    Mutant("the torch RNG is not put back", T, "        torch.set_rng_state(rng[0])\n", ""),
    Mutant(
        "Accelerate's shared state is not put back",
        T,
        "            state.clear()\n            state.update(saved)\n",
        "            pass\n",
    ),
    Mutant(
        "Accelerate's shared lists are saved by reference (verify's dataloaders left in the user's state)",
        T,
        "{k: copy.copy(v) if isinstance(v, (list, dict)) else v for",
        "{k: v for",
        equivalent="accelerate 1.15 never mutates GradientState's lists or dicts in place: its dataloader "
        "references and plugin_kwargs are always reassigned (state.py: 'explicitly use assignment'), "
        "so the saved object keeps the old contents; measured: [None] before and after, mid-epoch "
        "stops and a loss that raises included",
    ),
    Mutant(
        "functional dropout probabilities are not switched off in the copy",
        T,
        "                setattr(obj, name, 0.0)\n",
        "",
    ),
    Mutant(
        "functional dropout probabilities are not put back on the user's model",
        T,
        "        for obj, name, value in changed:\n            setattr(obj, name, value)",
        "        pass",
    ),
    Mutant(
        "the switched-off probabilities are not reported", T, "    if switched_off:  #", "    if False:  #"
    ),
    # --- losses.py ------------------------------------------------------------------------------------
    Mutant(
        "causal LM: no shift (position t scored against label t)",
        L,
        "logits, targets = logits[:, :-1], labels[:, 1:]",
        "targets = labels",
    ),
    Mutant(
        "causal LM: padding (-100) counted as items",
        L,
        "    return ce[targets != IGNORE_INDEX]\n",
        "    return ce\n",
    ),
    Mutant(
        "causal LM: label smoothing not applied",
        L,
        "        label_smoothing=label_smoothing,\n    )\n    return ce[targets",
        "    )\n    return ce[targets",
    ),
    Mutant(
        "causal LM: logits not upcast to float32 (bf16 cross-entropy)",
        L,
        'return (out["logits"] if isinstance(out, Mapping) else out[0]).float()',
        'return out["logits"] if isinstance(out, Mapping) else out[0]',
    ),
    Mutant(
        "causal LM: shift_labels not padded by the virtual tokens",
        L,
        'targets = F.pad(batch["shift_labels"], (v, 0), value=IGNORE_INDEX)',
        'targets = batch["shift_labels"]',
        tests=PEFT,
    ),
    Mutant(
        "prefix tuning's cached virtual tokens counted as logit positions",
        L,
        '    if str(getattr(config.peft_type, "value", config.peft_type)) in CACHE_PROMPTS:\n        return 0\n',
        "",
        tests=PEFT,
    ),
    Mutant(
        "prompt tuning's virtual tokens not counted",
        L,
        "return int(config.num_virtual_tokens)",
        "return 0",
        tests=PEFT,
    ),
    Mutant(
        "regression with several outputs: squared errors summed, not averaged",
        L,
        "return diff.pow(2) if n_labels == 1 else diff.pow(2).mean(-1)",
        "return diff.pow(2) if n_labels == 1 else diff.pow(2).sum(-1)",
    ),
    Mutant(
        "multi-label: binary cross-entropies summed over the labels, not averaged",
        L,
        'labels.float(), reduction="none").mean(-1)',
        'labels.float(), reduction="none").sum(-1)',
    ),
    Mutant(
        "one output taken for single-label classification, not regression",
        L,
        '            "regression"\n            if n_labels == 1\n',
        '            "regression"\n            if n_labels == 0\n',
    ),
    Mutant(
        "int32 labels taken for multi-label",
        L,
        "if labels.dtype in (torch.long, torch.int)\n",
        "if labels.dtype == torch.long\n",
        equivalent="int32 labels fail in torch's cross_entropy (Long or Byte only) inside the model's own loss, so "
        "no Trainer trains on them and no verify_trainer run reaches the item losses with them; the "
        "rule mirrors transformers' ForSequenceClassificationLoss, which refuses them the same way",
    ),
    Mutant(
        "config.problem_type ignored (always inferred)",
        L,
        'problem = getattr(config, "problem_type", None)',
        "problem = None",
    ),
    Mutant(
        "classification: labels of -100 counted as items",
        L,
        "    return ce[labels != IGNORE_INDEX]\n",
        "    return ce\n",
    ),
    Mutant(
        "classification: label smoothing not applied",
        L,
        "        label_smoothing=label_smoothing,\n    )\n    return ce[labels",
        "    )\n    return ce[labels",
    ),
    Mutant(
        "the default item losses drop label smoothing",
        L,
        "return functools.partial(losses, label_smoothing=label_smoothing) if label_smoothing else losses",
        "return losses",
    ),
    Mutant(
        "the default for a sequence classifier is the causal LM loss",
        L,
        '            "ForSequenceClassification",\n            sequence_classification_losses,\n',
        '            "ForSequenceClassification",\n            causal_lm_losses,\n',
    ),
    Mutant(
        "a model without a default loss gets the causal LM loss silently",
        L,
        '    raise ValueError(\n        "item_losses must be given',
        '    return causal_lm_losses\n    raise ValueError(\n        "item_losses must be given',
    ),
    # --- trl.py ----------------------------------------------------------------------------------------
    Mutant(
        "SFTTrainer is not among the judged trainers", R, 'JUDGED = ("SFTTrainer",)', "JUDGED = ()", tests=TRL
    ),
    Mutant(
        "a TRL trainer is told from its class's own module only, not its bases",
        R,
        "for c in type(trainer).__mro__)",
        "for c in type(trainer).__mro__[:1])",
        tests=TRL,
    ),
    Mutant(
        "DPOTrainer is not refused",
        R,
        '    raise TypeError(\n        f"trainer must be a transformers.Trainer or trl.SFTTrainer',
        '    return\n    raise TypeError(\n        f"trainer must be a transformers.Trainer or trl.SFTTrainer',
        tests=TRL,
    ),
    Mutant(
        "the copy re-prepares (re-tokenises, re-packs) the user's prepared dataset",
        R,
        '"skip_prepare_dataset": True}',
        '"skip_prepare_dataset": False}',
        tests=TRL,
        equivalent=PREPARED,
    ),
    Mutant(
        "a padding-free SFTTrainer's copy is handed the user's collator",
        R,
        'getattr(trainer, "padding_free", False)',
        "False",
        tests=TRL,
    ),
    Mutant(
        "the TRL constructor changes are not applied to the copy",
        T,
        "            ) | trl_kwargs(trainer)\n",
        "            )\n",
        tests=TRL,
    ),
    Mutant(
        "the TRL argument changes are not applied to the copy",
        T,
        "    changes |= trl_changes(args)\n",
        "",
        tests=TRL,
        equivalent=PREPARED,
    ),
    Mutant(
        "the user's processing_class is not forwarded",
        T,
        "processing_class=trainer.processing_class,",
        "processing_class=None,",
        tests=TRL,
    ),
]
