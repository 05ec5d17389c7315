"""Mutants of accumlib/hf/: verify_trainer (trainer.py), the item losses (losses.py), the TRL rules (trl.py).

tiny.py builds the offline tokenizer, models and texts the tests run on; it decides no verdict, so it
has no mutants here (a change there changes the fixtures, not what verify_trainer says about them).
"""

from mutate import Mutant

TESTS = ["tests/test_hf.py", "tests/test_hf_trainer_settings.py", "tests/test_hf_losses.py"]
TRL = ("tests/test_verify_trl.py",)  # the TRL rules only matter on a TRL trainer
# virtual tokens only matter on a PEFT adapter
PEFT = ("tests/test_verify_peft.py", "tests/test_hf_losses.py")

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
        "delete",
        "opt.load_state_dict(copy.deepcopy(user_opt.state_dict()))",
        killers=(
            "tests/test_hf_trainer_settings.py::test_the_copy_takes_the_same_steps_as_the_users_own_train",
        ),
    ),
    Mutant(
        "the user's optimizer state is shared, not deep-copied (the copy moves the user's momentum)",
        "replace",
        "copy.deepcopy(user_opt.state_dict())",
        "user_opt.state_dict()",
        killers=("tests/test_hf.py::test_the_users_optimizer_state_is_left_as_it_was",),
    ),
    Mutant(
        "the user's parameter-group hyperparameters are dropped (every group gets the defaults)",
        "replace",
        "{**{k: v for k, v in g.items() if k != 'params'}, 'params': [params[index[id(p)]] for p in "
        "g['params']]}",
        "{'params': [params[index[id(p)]] for p in g['params']]}",
        equivalent="the next lines load the user's state_dict into the rebuilt optimizer, and torch's "
        "Optimizer.load_state_dict takes every saved group's hyperparameters (keeping only its params): "
        "the groups' settings before it cannot show (the twin-run test sees lr 0.1 and weight decay either way)",
    ),
    Mutant(
        "an optimizer over parameters of another model is not refused",
        "replace",
        "if foreign:\n"
        "    raise ValueError(f'trainer.optimizer must hold only parameters of trainer.model (got "
        "{len(foreign)} others)')",
        "False",
        node="foreign",
        killers=(
            "tests/test_hf_trainer_settings.py::test_an_optimizer_over_another_models_parameters_is_refused",
        ),
    ),
    Mutant(
        "the user's scheduler is not copied (the Trainer builds its own)",
        "replace",
        "_copied_scheduler(user_sched, user_opt, opt)",
        "None",
        killers=("tests/test_hf.py::test_the_user_optimizer_and_scheduler_are_copied_not_used",),
    ),
    Mutant(
        "the scheduler's copy still drives a copy of the user's optimizer, not verify's",
        "replace",
        "copy.deepcopy(user_sched, memo={id(user_opt): opt})",
        "copy.deepcopy(user_sched)",
        killers=("tests/test_hf.py::test_the_user_optimizer_and_scheduler_are_copied_not_used",),
    ),
    Mutant(
        "the user's stateful callbacks are passed as they are, not copied",
        "replace",
        "copy.deepcopy(cb)",
        "cb",
        within="_copied_callbacks",
        killers=(
            "tests/test_hf_trainer_settings.py::test_the_users_callbacks_run_in_the_copy_and_stay_untouched",
        ),
    ),
    Mutant(
        "the user's callbacks are left out of the copy",
        "replace",
        "_copied_callbacks(trainer)",
        "None",
        killers=(
            "tests/test_hf_trainer_settings.py::test_the_copy_takes_the_same_steps_as_the_users_own_train",
        ),
    ),
    Mutant(
        "the user's compute_loss_func is not forwarded",
        "replace",
        "getattr(trainer, 'compute_loss_func', None)",
        "None",
        killers=(
            "tests/test_hf_trainer_settings.py::test_the_users_compute_loss_func_is_what_the_copy_trains_with",
        ),
    ),
    Mutant(
        "the user's optimizer_cls_and_kwargs is not forwarded",
        "replace",
        "getattr(trainer, 'optimizer_cls_and_kwargs', None)",
        "None",
        killers=(
            "tests/test_hf_trainer_settings.py::test_the_users_optimizer_class_and_kwargs_build_the_copys_optimizer",
        ),
    ),
    Mutant(
        "the user's item_losses is ignored for the default",
        "drop-clause",
        "item_losses or default_item_losses(model, args.label_smoothing_factor)",
        "item_losses",
        killers=("tests/test_hf_trainer_settings.py::test_the_users_item_losses_define_the_oracle",),
    ),
    Mutant(
        "label_smoothing_factor is not passed to the default item losses",
        "replace",
        "default_item_losses(model, args.label_smoothing_factor)",
        "default_item_losses(model)",
        killers=(
            "tests/test_hf_trainer_settings.py::test_label_smoothing_factor_is_counted_in_the_item_losses",
        ),
    ),
    # --- trainer.py: the training arguments of the copy ---------------------------------------------
    Mutant(
        "the user's num_train_epochs is kept (every epoch judged, not one)",
        "replace",
        "changes['num_train_epochs'] = 1",
        "pass",
        killers=(
            "tests/test_hf_trainer_settings.py::test_settings_the_copy_turns_off_leave_one_exact_epoch",
        ),
    ),
    Mutant(
        "the user's TrainingArguments are changed in place",
        "replace",
        "return dataclasses.replace(args, **{k: v for k, v in changes.items() if k in fields})",
        "for k, v in changes.items():\n    if k in fields:\n        setattr(args, k, v)\nreturn args",
        killers=(
            "tests/test_hf_trainer_settings.py::test_settings_the_copy_turns_off_leave_one_exact_epoch",
        ),
    ),
    Mutant(
        "args.max_steps and max_steps= combined with max (the larger), not min",
        "replace",
        "min([n for n in (max_steps, args.max_steps if args.max_steps and args.max_steps > 0 else "
        "None) if n], default=None)",
        "max",
        node="min",
        killers=("tests/test_hf_trainer_settings.py::test_args_max_steps_and_max_steps_judge_the_smaller",),
    ),
    Mutant(
        "args.max_steps is not a cap (only max_steps= counts)",
        "replace",
        "(max_steps, args.max_steps if args.max_steps and args.max_steps > 0 else None)",
        "(max_steps,)",
        killers=("tests/test_hf_trainer_settings.py::test_args_max_steps_and_max_steps_judge_the_smaller",),
    ),
    Mutant(
        "dataloader workers kept in the copy",
        "replace",
        "dict(output_dir=output_dir, report_to=[], save_strategy='no', eval_strategy='no', "
        "load_best_model_at_end=False, eval_on_start=False, push_to_hub=False, "
        "dataloader_num_workers=0, dataloader_prefetch_factor=None, "
        "dataloader_persistent_workers=False, neftune_noise_alpha=None, disable_tqdm=True)",
        "args.dataloader_num_workers",
        node="0",
        killers=(
            "tests/test_hf_trainer_settings.py::test_settings_the_copy_turns_off_leave_one_exact_epoch",
        ),
    ),
    Mutant(
        "NEFTune noise kept in the copy",
        "replace",
        "dict(output_dir=output_dir, report_to=[], save_strategy='no', eval_strategy='no', "
        "load_best_model_at_end=False, eval_on_start=False, push_to_hub=False, "
        "dataloader_num_workers=0, dataloader_prefetch_factor=None, "
        "dataloader_persistent_workers=False, neftune_noise_alpha=None, disable_tqdm=True)",
        "args.neftune_noise_alpha",
        node="None",
        at=1,
        killers=(
            "tests/test_hf_trainer_settings.py::test_settings_the_copy_turns_off_leave_one_exact_epoch",
        ),
    ),
    Mutant(
        "evaluation kept in the copy",
        "replace",
        "dict(output_dir=output_dir, report_to=[], save_strategy='no', eval_strategy='no', "
        "load_best_model_at_end=False, eval_on_start=False, push_to_hub=False, "
        "dataloader_num_workers=0, dataloader_prefetch_factor=None, "
        "dataloader_persistent_workers=False, neftune_noise_alpha=None, disable_tqdm=True)",
        "args.eval_strategy",
        node="'no'",
        at=1,
        killers=(
            "tests/test_hf_trainer_settings.py::test_settings_the_copy_turns_off_leave_one_exact_epoch",
        ),
    ),
    Mutant(
        "the copy writes to the user's output_dir",
        "replace",
        "output_dir",
        "args.output_dir",
        within="_training_args",
        killers=(
            "tests/test_hf_trainer_settings.py::test_settings_the_copy_turns_off_leave_one_exact_epoch",
        ),
    ),
    Mutant(
        "the copy's Trainer prints its end-of-training metrics",
        "replace",
        "copy_of.remove_callback(PrinterCallback)",
        "pass",
        killers=(
            "tests/test_hf_trainer_settings.py::test_settings_the_copy_turns_off_leave_one_exact_epoch",
        ),
    ),
    Mutant(
        "a length-grouped sampler reads lengths through verify's recording dataset",
        "replace",
        "_as_sampled(copy_of, trainer.train_dataset)",
        "dataset",
        killers=(
            "tests/test_hf_trainer_settings.py::test_a_length_grouped_sampler_groups_as_the_users_trainer_does",
        ),
    ),
    Mutant(
        "a length-grouped sampler reads a datasets.Dataset's length column the Trainer removes",
        "replace",
        "copy_of._remove_unused_columns(dataset, description='Training')",
        "dataset",
        killers=(
            "tests/test_hf_trainer_settings.py::test_a_length_grouped_sampler_groups_as_the_users_trainer_does",
        ),
    ),
    # --- trainer.py: refusals before any work --------------------------------------------------------
    Mutant(
        "n_gpu > 1 (DataParallel) is not refused",
        "constant",
        "args.n_gpu > 1",
        "8",
        node="1",
        killers=("tests/test_hf_trainer_settings.py::test_data_parallel_over_two_gpus_is_refused",),
    ),
    Mutant(
        "FSDP args are not refused",
        "replace",
        "(('deepspeed', args.deepspeed), ('fsdp', args.fsdp), ('parallelism_config', pc if split else None))",
        "(('deepspeed', args.deepspeed), ('parallelism_config', pc if split else None))",
        killers=("tests/test_hf_trainer_settings.py::test_fsdp_in_the_trainers_args_is_refused",),
    ),
    Mutant(
        "a Trainer without a train_dataset is not refused by name",
        "replace",
        "trainer.train_dataset is None",
        "False",
        killers=("tests/test_hf_trainer_settings.py::test_arguments_verify_cannot_use_are_refused_by_name",),
    ),
    Mutant(
        "max_steps=0 is accepted",
        "constant",
        "check_int('max_steps', max_steps, low=1, optional=True)",
        "0",
        node="1",
        within="_check_trainer",
        killers=("tests/test_hf.py::test_bad_arguments_are_refused_by_name",),
    ),
    # --- trainer.py: the user's process state and randomness -----------------------------------------
    Mutant(
        "the torch RNG is not put back",
        "delete",
        "torch.set_rng_state(rng[0])",
        killers=("tests/test_hf.py::test_the_users_objects_are_untouched",),
    ),
    Mutant(
        "Accelerate's shared state is not put back",
        "replace",
        "for state, saved in shared:\n    state.clear()\n    state.update(saved)",
        "for state, saved in shared:\n    pass",
        killers=("tests/test_hf.py::test_the_users_objects_are_untouched",),
    ),
    Mutant(
        "Accelerate's shared lists are saved by reference (verify's dataloaders left in the user's state)",
        "replace",
        "copy.copy(v) if isinstance(v, (list, dict)) else v",
        "v",
        equivalent="accelerate 1.15 never mutates GradientState's lists or dicts in place: its dataloader "
        "references and plugin_kwargs are always reassigned (state.py: 'explicitly use assignment'), "
        "so the saved object keeps the old contents; measured: [None] before and after, mid-epoch "
        "stops and a loss that raises included",
    ),
    Mutant(
        "functional dropout probabilities are not switched off in the copy",
        "delete",
        "setattr(obj, name, 0.0)",
        killers=(
            "tests/test_hf_trainer_settings.py::test_functional_dropout_is_off_in_the_copy_and_back_on_the_users_model",
        ),
    ),
    Mutant(
        "functional dropout probabilities are not put back on the user's model",
        "replace",
        "for obj, name, value in changed:\n    setattr(obj, name, value)",
        "pass",
        killers=("tests/test_hf.py::test_the_users_objects_are_untouched",),
    ),
    Mutant(
        "the switched-off probabilities are not reported",
        "replace",
        "if switched_off:\n"
        "    names = ', '.join((f'{n}={v:g}' for n, v in switched_off))\n"
        "    form = 'randomness-too' if 'dropout' in report.codes else 'randomness'\n"
        "    report = report.with_finding(Finding.of('dropout', form=form, names=names))",
        "False",
        node="switched_off",
        killers=(
            "tests/test_hf_trainer_settings.py::test_functional_dropout_is_off_in_the_copy_and_back_on_the_users_model",
        ),
    ),
    # --- losses.py ------------------------------------------------------------------------------------
    Mutant(
        "causal LM: no shift (position t scored against label t)",
        "replace",
        "logits, targets = (logits[:, :-1], labels[:, 1:])",
        "targets = labels",
        killers=("tests/test_hf.py::test_causal_lm_losses_average_to_the_models_own_loss",),
    ),
    Mutant(
        "causal LM: padding (-100) counted as items",
        "replace",
        "ce[targets != IGNORE_INDEX]",
        "ce",
        within="causal_lm_losses",
        killers=("tests/test_hf.py::test_causal_lm_losses_average_to_the_models_own_loss",),
    ),
    Mutant(
        "causal LM: label smoothing not applied",
        "replace",
        "F.cross_entropy(logits.reshape(targets.numel(), -1), targets, reduction='none', "
        "ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)",
        "F.cross_entropy(logits.reshape(targets.numel(), -1), targets, reduction='none', "
        "ignore_index=IGNORE_INDEX)",
        killers=(
            "tests/test_hf_trainer_settings.py::test_label_smoothing_factor_is_counted_in_the_item_losses",
        ),
    ),
    Mutant(
        "causal LM: logits not upcast to float32 (bf16 cross-entropy)",
        "replace",
        "(out['logits'] if isinstance(out, Mapping) else out[0]).float()",
        "out['logits'] if isinstance(out, Mapping) else out[0]",
        killers=("tests/test_hf_losses.py::test_a_bf16_models_token_losses_are_computed_in_float32",),
    ),
    Mutant(
        "causal LM: shift_labels not padded by the virtual tokens",
        "replace",
        "F.pad(batch['shift_labels'], (v, 0), value=IGNORE_INDEX)",
        "batch['shift_labels']",
        killers=("tests/test_hf_losses.py::test_shift_labels_after_prompt_tuning_score_the_real_positions",),
        tests=PEFT,
    ),
    Mutant(
        "prefix tuning's cached virtual tokens counted as logit positions",
        "delete",
        "if str(getattr(config.peft_type, 'value', config.peft_type)) in CACHE_PROMPTS:\n    return 0",
        killers=("tests/test_verify_peft.py::test_causal_lm_losses_average_to_the_adapted_models_own_loss",),
        tests=PEFT,
    ),
    Mutant(
        "prompt tuning's virtual tokens not counted",
        "replace",
        "int(config.num_virtual_tokens)",
        "0",
        killers=("tests/test_verify_peft.py::test_causal_lm_losses_average_to_the_adapted_models_own_loss",),
        tests=PEFT,
    ),
    Mutant(
        "regression with several outputs: squared errors summed, not averaged",
        "replace",
        "diff.pow(2).mean",
        "diff.pow(2).sum",
        killers=(
            "tests/test_hf_losses.py::test_sequence_classification_losses_average_to_the_models_own_loss",
        ),
    ),
    Mutant(
        "multi-label: binary cross-entropies summed over the labels, not averaged",
        "replace",
        "F.binary_cross_entropy_with_logits(logits, labels.float(), reduction='none').mean",
        "F.binary_cross_entropy_with_logits(logits, labels.float(), reduction='none').sum",
        killers=(
            "tests/test_hf_losses.py::test_sequence_classification_losses_average_to_the_models_own_loss",
        ),
    ),
    Mutant(
        "one output taken for single-label classification, not regression",
        "constant",
        "'regression' if n_labels == 1 else 'single_label_classification' if labels.dtype in "
        "(torch.long, torch.int) else 'multi_label_classification'",
        "0",
        node="1",
        killers=(
            "tests/test_hf_losses.py::test_sequence_classification_losses_average_to_the_models_own_loss",
        ),
    ),
    Mutant(
        "int32 labels taken for multi-label",
        "replace",
        "labels.dtype in (torch.long, torch.int)",
        "labels.dtype == torch.long",
        equivalent="int32 labels fail in torch's cross_entropy (Long or Byte only) inside the model's own loss, so "
        "no Trainer trains on them and no verify_trainer run reaches the item losses with them; the "
        "rule mirrors transformers' ForSequenceClassificationLoss, which refuses them the same way",
    ),
    Mutant(
        "config.problem_type ignored (always inferred)",
        "replace",
        "getattr(config, 'problem_type', None)",
        "None",
        killers=(
            "tests/test_hf_losses.py::test_sequence_classification_losses_average_to_the_models_own_loss",
        ),
    ),
    Mutant(
        "classification: labels of -100 counted as items",
        "replace",
        "ce[labels != IGNORE_INDEX]",
        "ce",
        killers=(
            "tests/test_hf_losses.py::test_sequence_classification_losses_average_to_the_models_own_loss",
        ),
    ),
    Mutant(
        "classification: label smoothing not applied",
        "replace",
        "F.cross_entropy(logits.reshape(labels.numel(), n_labels), labels, reduction='none', "
        "ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)",
        "F.cross_entropy(logits.reshape(labels.numel(), n_labels), labels, reduction='none', "
        "ignore_index=IGNORE_INDEX)",
        killers=("tests/test_hf_losses.py::test_label_smoothing_matches_the_trainers_label_smoother",),
    ),
    Mutant(
        "the default item losses drop label smoothing",
        "replace",
        "functools.partial(losses, label_smoothing=label_smoothing) if label_smoothing else losses",
        "losses",
        killers=(
            "tests/test_hf_trainer_settings.py::test_label_smoothing_factor_is_counted_in_the_item_losses",
        ),
    ),
    Mutant(
        "the default for a sequence classifier is the causal LM loss",
        "replace",
        "(auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, 'ForSequenceClassification', "
        "sequence_classification_losses)",
        "causal_lm_losses",
        node="sequence_classification_losses",
        killers=("tests/test_hf.py::test_verify_trainer_names_the_classification_bug",),
    ),
    Mutant(
        "a model without a default loss gets the causal LM loss silently",
        "replace",
        "for names, suffix, losses in ((auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, 'ForCausalLM', "
        "causal_lm_losses), (auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, "
        "'ForSequenceClassification', sequence_classification_losses)):\n"
        "    if name in _class_names(names) or name.endswith(suffix):\n"
        "        return functools.partial(losses, label_smoothing=label_smoothing) if label_smoothing "
        "else losses",
        "for names, suffix, losses in ((auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, 'ForCausalLM', "
        "causal_lm_losses), (auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, "
        "'ForSequenceClassification', sequence_classification_losses)):\n"
        "    if name in _class_names(names) or name.endswith(suffix):\n"
        "        return functools.partial(losses, label_smoothing=label_smoothing) if label_smoothing "
        "else losses\n"
        "return causal_lm_losses",
        killers=("tests/test_hf.py::test_a_model_without_a_default_item_loss_needs_item_losses",),
    ),
    # --- trl.py ----------------------------------------------------------------------------------------
    Mutant(
        "SFTTrainer is not among the judged trainers",
        "replace",
        "('SFTTrainer',)",
        "()",
        killers=("tests/test_verify_trl.py::test_sft_on_llama_is_exact",),
        tests=TRL,
    ),
    Mutant(
        "a TRL trainer is told from its class's own module only, not its bases",
        "replace",
        "(c.__module__.split('.')[0] == 'trl' for c in type(trainer).__mro__)",
        "type(trainer).__mro__[:1]",
        node="type(trainer).__mro__",
        killers=("tests/test_verify_trl.py::test_sft_on_llama_is_exact",),
        tests=TRL,
    ),
    Mutant(
        "DPOTrainer is not refused",
        "replace",
        'why = next((REFUSED[n] for n in names if n in REFUSED), "verify_trainer knows the loss of '
        "TRL's SFTTrainer only\")",
        'why = next((REFUSED[n] for n in names if n in REFUSED), "verify_trainer knows the loss of '
        "TRL's SFTTrainer only\")\n"
        "return",
        killers=("tests/test_verify_trl.py::test_dpo_is_refused_by_name_before_it_runs",),
        tests=TRL,
    ),
    Mutant(
        "the copy re-prepares (re-tokenises, re-packs) the user's prepared dataset",
        "constant",
        "{**(args.dataset_kwargs or {}), 'skip_prepare_dataset': True}",
        "False",
        node="True",
        equivalent=PREPARED,
        tests=TRL,
    ),
    Mutant(
        "a padding-free SFTTrainer's copy is handed the user's collator",
        "replace",
        "getattr(trainer, 'padding_free', False)",
        "False",
        killers=("tests/test_verify_trl.py::test_sft_on_llama_is_exact",),
        tests=TRL,
    ),
    Mutant(
        "the TRL constructor changes are not applied to the copy",
        "drop-factor",
        "dict(model=net, args=_training_args(args, out, cap), data_collator=trainer.data_collator, "
        "train_dataset=trainer.train_dataset, processing_class=trainer.processing_class, "
        "callbacks=_copied_callbacks(trainer), compute_loss_func=getattr(trainer, 'compute_loss_func', "
        "None), optimizers=(opt, _copied_scheduler(user_sched, user_opt, opt)) if user_opt is not None "
        "else (None, None), optimizer_cls_and_kwargs=getattr(trainer, 'optimizer_cls_and_kwargs', "
        "None)) | trl_kwargs(trainer)",
        "trl_kwargs(trainer)",
        killers=("tests/test_verify_trl.py::test_sft_on_llama_is_exact",),
        tests=TRL,
    ),
    Mutant(
        "the TRL argument changes are not applied to the copy",
        "delete",
        "changes |= trl_changes(args)",
        equivalent=PREPARED,
        tests=TRL,
    ),
    Mutant(
        "the user's processing_class is not forwarded",
        "replace",
        "trainer.processing_class",
        "None",
        killers=("tests/test_verify_trl.py::test_sft_on_llama_is_exact",),
        tests=TRL,
    ),
]
