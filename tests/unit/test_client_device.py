"""Where the trainer-side Loader lands batches by default."""

import torch

from mdata.trainer import default_device


def test_cpu_only_machines_get_plain_cpu_tensors(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert default_device() is None


def test_with_cuda_each_process_uses_its_local_rank(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the system boundary
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert default_device() == torch.device("cuda", 3)
    monkeypatch.delenv("LOCAL_RANK")
    assert default_device() == torch.device("cuda", 0)
