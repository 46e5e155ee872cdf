"""Training: ``step.train_step`` (one page), the epoch loop ``loop.train_one_epoch`` and ``fit.fit`` with ``optim``
(optimizer, schedules), ``rundir`` (the run folder), ``records`` (what it reports), ``state`` (checkpoints)."""
