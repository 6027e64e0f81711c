"""Fixtures the pipeline tests share."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def one_thread():
    """One torch thread for the test: results do not depend on how many cores run it, and the
    suite's other processes keep theirs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
