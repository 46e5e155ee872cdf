"""``python -m yolo9kit``: the command-line entry (see ``yolo9kit.cli``)."""

from yolo9kit.cli import main

raise SystemExit(main())
