"""The suite's own ordering: the files it names to run first are files of the suite."""

from __future__ import annotations

from tests.conftest import LONGEST_FILES, REPO_ROOT


def test_every_file_named_to_run_first_exists():
    missing = [name for name in LONGEST_FILES if not (REPO_ROOT / name).is_file()]
    assert missing == []


def test_no_file_is_named_twice_to_run_first():
    assert len(set(LONGEST_FILES)) == len(LONGEST_FILES)
