"""What several fault test files share: a file's digest, a pid that no process has, a command run in-process with
its exit code and output, the one line an error must be, and labels of a class that data.yaml does not name."""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

from yolo9kit.cli import main

DEAD_PID = 4_194_305  # above Linux's largest pid_max: no process has it


def digest(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """Exit code and everything printed (stdout and stderr) of ``python -m yolo9kit ARGV`` run in-process."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse errors
        code = e.code
    captured = capsys.readouterr()
    return code, captured.err + captured.out


def one_error_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def train_labels(data_yaml: Path) -> list[Path]:
    return sorted((data_yaml.parent / "labels" / "train").glob("*.txt"))


def one_unnamed_class(data_yaml: Path) -> None:
    """One training image labelled with class 1, the others (and the val images) with class 0; then ``names``
    loses class 1."""
    for i, label in enumerate(train_labels(data_yaml)):
        label.write_text(f"{int(i == 0)} 0.5 0.5 0.2 0.2\n")
    for label in (data_yaml.parent / "labels" / "val").glob("*.txt"):
        label.write_text("0 0.5 0.5 0.2 0.2\n")
    config = yaml.safe_load(data_yaml.read_text())
    data_yaml.write_text(yaml.safe_dump({**config, "names": ["rectangle"]}))
