"""Training. ``fit`` (``train.fit``) runs it: the epoch loop of ``train_one_epoch`` (``train.loop``) over the step
of ``train.step``, the optimizer and schedules of ``train.optim``, the EMA (``train.ema``), the run folder
(``train.rundir``), what it reports (``train.records``) and its checkpoints (``train.state``)."""
