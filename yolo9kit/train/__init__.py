"""Training. The step is ``yolo9kit/train/step.py`` ``train_step`` (one page: forward, loss, backward, optimizer
step, EMA); the epoch loop around it is ``yolo9kit/train/loop.py`` ``train_one_epoch``; ``fit`` (``train.fit``)
runs them with the optimizer and schedules of ``train.optim``, the run folder (``train.rundir``), what it reports
(``train.records``) and its checkpoints (``train.state``)."""
