"""Mutants of accumlib/lightning.py: verify_fit, accumlib.verify on a real Lightning Trainer.fit."""

from mutate import Mutant

TESTS = ["tests/test_lightning_fit.py", "tests/test_lightning_trainer_settings.py"]

L = "accumlib/lightning.py"
VERIFY_RECHECKS = (
    "verify() refuses the same max_steps with the same message before anything runs "
    "(accumlib/_verify/api.py check_args), so verify_fit refuses 0 either way"
)
MUTANTS = [
    # what the user's Trainer and loader say
    Mutant(
        "the default accumulate_grad_batches taken as 2, not Lightning's 1",
        L,
        'trainer_kwargs.get("accumulate_grad_batches", 1)',
        'trainer_kwargs.get("accumulate_grad_batches", 2)',
        at=1,
    ),
    Mutant(
        "verify judges windows of one whatever accumulate_grad_batches says",
        L,
        "accum_steps=k,",
        "accum_steps=1,",
    ),
    Mutant("a loader's drop_last=True not followed", L, "drop_last=user.drop_last", "drop_last=False"),
    Mutant(
        "the user's sampler not followed (a shuffled loader trained in dataset order)",
        L,
        "            sampler=sampler,\n",
        "            sampler=None,\n",
    ),
    Mutant(
        "the loader's own generator not passed (its seed draw skipped: another shuffle)",
        L,
        "            generator=generator,\n",
        "",
    ),
    Mutant(
        "the user's sampler used, not a copy (drawing moves the user's generator)",
        L,
        "return copy.deepcopy((loader.sampler, loader.generator), memo={id(loader.dataset): loader.dataset})",
        "return loader.sampler, loader.generator",
    ),
    Mutant(
        "the user's workers kept (batches drawn where verify cannot record them)",
        L,
        "num_workers=0,",
        "num_workers=user.num_workers,",
    ),
    Mutant(
        "max_steps not forwarded to the Trainer",
        L,
        'kwargs |= {"max_steps": max_steps} if max_steps else {"max_epochs": 1}',
        'kwargs |= {"max_epochs": 1}',
    ),
    Mutant(
        "max_steps not forwarded to verify", L, "            max_steps=max_steps,\n        )", "        )"
    ),
    # the user's callbacks
    Mutant(
        "the user's callbacks dropped",
        L,
        "callbacks=own, default_root_dir=root",
        "callbacks=[], default_root_dir=root",
    ),
    Mutant(
        "the user's callbacks run as they are, not copies",
        L,
        "own = [copy.deepcopy(cb) for cb in callbacks",
        "own = [cb for cb in callbacks",
    ),
    Mutant(
        "a checkpointing callback kept (writes files)",
        L,
        " if not isinstance(cb, pl.callbacks.Checkpoint)]",
        "]",
    ),
    Mutant(
        "one callback not in a list is not wrapped",
        L,
        "callbacks = [callbacks] if not isinstance(callbacks, (list, tuple)) else callbacks\n",
        "",
    ),
    # the user's state
    Mutant("the global random generators not put back", L, "        torch.set_rng_state(state[0])\n", ""),
    Mutant(
        "Lightning's logger level not put back", L, "            log.setLevel(level)\n", "            pass\n"
    ),
    Mutant(
        "training_step not routed through the module's __call__ (verify's hook never sees a micro-batch)",
        L,
        "        lm.training_step = lambda *a, **kw: steps(*a, **kw)",
        "        pass",
    ),
    # refusals
    Mutant(
        "devices=[0, 1] accepted (any list of devices)",
        L,
        "(isinstance(devices, (list, tuple)) and len(devices) == 1)",
        "isinstance(devices, (list, tuple))",
    ),
    # killed by timeout: Lightning then waits for a second node's rendezvous (a real hang, not load)
    Mutant("num_nodes not checked", L, '        or trainer_kwargs.get("num_nodes", 1) != 1\n', ""),
    Mutant("devices='1' refused (only the integer 1 accepted)", L, 'devices in (1, "1")', "devices == 1"),
    Mutant(
        "max_steps=0 accepted",
        L,
        'check_int("max_steps", max_steps, low=1, optional=True)',
        'check_int("max_steps", max_steps, low=0, optional=True)',
        equivalent=VERIFY_RECHECKS,
    ),
    Mutant(
        "a module that is not a LightningModule accepted",
        L,
        "        if isinstance(module, pl.LightningModule):\n            return pl",
        "        return pl",
    ),
    Mutant(
        "a loader with its own batch_sampler accepted",
        L,
        "    if train_dataloaders.batch_size is None:\n        raise",
        "    if False:\n        raise",
    ),
    Mutant(
        "item_losses not checked callable",
        L,
        '    check_callable("item_losses", item_losses, "item_losses(module, batch)")\n',
        "",
    ),
]
