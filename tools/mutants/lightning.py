"""Mutants of accumlib/lightning.py: verify_fit, accumlib.verify on a real Lightning Trainer.fit."""

from mutate import Mutant

TESTS = ["tests/test_lightning_fit.py", "tests/test_lightning_trainer_settings.py"]

VERIFY_RECHECKS = (
    "verify() refuses the same max_steps with the same message before anything runs "
    "(accumlib/_verify/api.py check_args), so verify_fit refuses 0 either way"
)
MUTANTS = [
    # what the user's Trainer and loader say
    Mutant(
        "the default accumulate_grad_batches taken as 2, not Lightning's 1",
        "constant",
        "k = trainer_kwargs.get('accumulate_grad_batches', 1)",
        "2",
        node="1",
        killers=(
            "tests/test_lightning_trainer_settings.py::test_without_accumulate_grad_batches_every_micro_batch_is_a_step",
        ),
    ),
    Mutant(
        "verify judges windows of one whatever accumulate_grad_batches says",
        "replace",
        "verify(train_fn, model=_Steps(module), dataset=user.dataset, item_losses=lambda m, b: "
        "item_losses(m.module, b), accum_steps=k, batch_size=user.batch_size, "
        "collate_fn=user.collate_fn, max_steps=max_steps)",
        "1",
        node="k",
        killers=("tests/test_lightning_fit.py::test_lightning_divides_the_last_window_by_k",),
    ),
    Mutant(
        "a loader's drop_last=True not followed",
        "replace",
        "user.drop_last",
        "False",
        killers=(
            "tests/test_lightning_trainer_settings.py::test_a_loader_that_drops_its_last_batch_is_followed",
        ),
    ),
    Mutant(
        "the user's sampler not followed (a shuffled loader trained in dataset order)",
        "replace",
        "sampler",
        "None",
        within="verify_fit.train_fn",
        killers=(
            "tests/test_lightning_trainer_settings.py::test_lightning_trains_on_the_users_shuffled_order",
        ),
    ),
    Mutant(
        "the loader's own generator not passed (its seed draw skipped: another shuffle)",
        "replace",
        "DataLoader(loader.dataset, batch_size=user.batch_size, sampler=sampler, "
        "drop_last=user.drop_last, collate_fn=loader.collate_fn, generator=generator, num_workers=0, "
        "pin_memory=user.pin_memory)",
        "DataLoader(loader.dataset, batch_size=user.batch_size, sampler=sampler, "
        "drop_last=user.drop_last, collate_fn=loader.collate_fn, num_workers=0, "
        "pin_memory=user.pin_memory)",
        killers=(
            "tests/test_lightning_trainer_settings.py::test_lightning_trains_on_the_users_shuffled_order",
        ),
    ),
    Mutant(
        "the user's sampler used, not a copy (drawing moves the user's generator)",
        "replace",
        "copy.deepcopy((loader.sampler, loader.generator), memo={id(loader.dataset): loader.dataset})",
        "(loader.sampler, loader.generator)",
        killers=("tests/test_lightning_fit.py::test_the_users_module_and_loader_are_untouched",),
    ),
    Mutant(
        "the user's workers kept (batches drawn where verify cannot record them)",
        "replace",
        "0",
        "user.num_workers",
        within="verify_fit.train_fn",
        killers=(
            "tests/test_lightning_trainer_settings.py::test_a_loader_with_workers_is_judged_like_one_without",
        ),
    ),
    Mutant(
        "max_steps not forwarded to the Trainer",
        "replace",
        "{'max_steps': max_steps} if max_steps else {'max_epochs': 1}",
        "{'max_epochs': 1}",
        killers=(
            "tests/test_lightning_trainer_settings.py::test_max_steps_past_one_epoch_runs_into_the_next",
        ),
    ),
    Mutant(
        "max_steps not forwarded to verify",
        "replace",
        "verify(train_fn, model=_Steps(module), dataset=user.dataset, item_losses=lambda m, b: "
        "item_losses(m.module, b), accum_steps=k, batch_size=user.batch_size, "
        "collate_fn=user.collate_fn, max_steps=max_steps)",
        "verify(train_fn, model=_Steps(module), dataset=user.dataset, item_losses=lambda m, b: "
        "item_losses(m.module, b), accum_steps=k, batch_size=user.batch_size, "
        "collate_fn=user.collate_fn)",
        killers=("tests/test_lightning_fit.py::test_max_steps_judges_two_steps",),
    ),
    # the user's callbacks
    Mutant(
        "the user's callbacks dropped",
        "replace",
        "pl.Trainer(**kwargs, callbacks=own, default_root_dir=root)",
        "[]",
        node="own",
        killers=("tests/test_lightning_trainer_settings.py::test_the_users_callback_takes_part_on_a_copy",),
    ),
    Mutant(
        "the user's callbacks run as they are, not copies",
        "replace",
        "[copy.deepcopy(cb) for cb in callbacks if not isinstance(cb, pl.callbacks.Checkpoint)]",
        "cb",
        node="copy.deepcopy(cb)",
        killers=("tests/test_lightning_trainer_settings.py::test_the_users_callback_takes_part_on_a_copy",),
    ),
    Mutant(
        "a checkpointing callback kept (writes files)",
        "replace",
        "[copy.deepcopy(cb) for cb in callbacks if not isinstance(cb, pl.callbacks.Checkpoint)]",
        "[copy.deepcopy(cb) for cb in callbacks]",
        killers=("tests/test_lightning_fit.py::test_the_users_module_and_loader_are_untouched",),
    ),
    Mutant(
        "one callback not in a list is not wrapped",
        "delete",
        "callbacks = [callbacks] if not isinstance(callbacks, (list, tuple)) else callbacks",
        killers=("tests/test_lightning_trainer_settings.py::test_the_users_callback_takes_part_on_a_copy",),
    ),
    # the user's state
    Mutant(
        "the global random generators not put back",
        "delete",
        "torch.set_rng_state(state[0])",
        killers=(
            "tests/test_lightning_trainer_settings.py::test_a_loader_on_the_global_generator_leaves_it_where_it_was",
        ),
    ),
    Mutant(
        "Lightning's logger level not put back",
        "replace",
        "log.setLevel(level)",
        "pass",
        within="train_fn",
        killers=("tests/test_lightning_fit.py::test_the_users_module_and_loader_are_untouched",),
    ),
    Mutant(
        "training_step not routed through the module's __call__ (verify's hook never sees a micro-batch)",
        "replace",
        "lm.training_step = lambda *a, **kw: steps(*a, **kw)",
        "pass",
        killers=("tests/test_lightning_fit.py::test_lightning_divides_the_last_window_by_k",),
    ),
    # refusals
    Mutant(
        "devices=[0, 1] accepted (any list of devices)",
        "drop-clause",
        "isinstance(devices, (list, tuple)) and len(devices) == 1",
        "len(devices) == 1",
        killers=(
            "tests/test_lightning_trainer_settings.py::test_more_than_one_process_or_device_is_refused",
        ),
    ),
    # killed by timeout: Lightning then waits for a second node's rendezvous (a real hang, not load)
    Mutant(
        "num_nodes not checked",
        "drop-clause",
        "not (devices in (1, '1') or (isinstance(devices, (list, tuple)) and len(devices) == 1)) or "
        "trainer_kwargs.get('num_nodes', 1) != 1",
        "trainer_kwargs.get('num_nodes', 1) != 1",
        killers=(
            "tests/test_lightning_trainer_settings.py::test_more_than_one_process_or_device_is_refused",
        ),
    ),
    Mutant(
        "devices='1' refused (only the integer 1 accepted)",
        "replace",
        "devices in (1, '1')",
        "devices == 1",
        killers=("tests/test_lightning_trainer_settings.py::test_one_device_named_by_a_string_runs",),
    ),
    Mutant(
        "max_steps=0 accepted",
        "constant",
        "check_int('max_steps', max_steps, low=1, optional=True)",
        "0",
        node="1",
        within="_check",
        equivalent=VERIFY_RECHECKS,
        killers=("tests/test_lightning_fit.py::test_bad_input_is_refused_by_name",),
    ),
    Mutant(
        "a module that is not a LightningModule accepted",
        "replace",
        "if isinstance(module, pl.LightningModule):\n    return pl",
        "return pl",
        killers=("tests/test_lightning_fit.py::test_bad_input_is_refused_by_name",),
    ),
    Mutant(
        "a loader with its own batch_sampler accepted",
        "replace",
        "train_dataloaders.batch_size is None",
        "False",
        killers=("tests/test_lightning_fit.py::test_bad_input_is_refused_by_name",),
    ),
    Mutant(
        "item_losses not checked callable",
        "delete",
        "check_callable('item_losses', item_losses, 'item_losses(module, batch)')",
        killers=("tests/test_lightning_fit.py::test_bad_input_is_refused_by_name",),
    ),
]
