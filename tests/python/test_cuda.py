"""CUDA tensors through tpd.rpc by the group's device maps (two GPUs; skipped without)."""

import pytest
import torch

import rpc_workers
import scenarios

needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs two CUDA GPUs (run on the GPU machine: docs/python.md)")


@needs_two_gpus
def test_cuda_tensors_follow_the_device_maps_on_one_node(daemon, workdir):
    results = rpc_workers.run(scenarios.cuda_maps, 2, [daemon.socket],
                              f"file://{workdir}/rendezvous")
    assert results == {0: True, 1: True}


@needs_two_gpus
def test_cuda_tensors_follow_the_device_maps_across_two_daemons(two_daemons, workdir):
    results = rpc_workers.run(scenarios.cuda_maps, 2, [d.socket for d in two_daemons],
                              f"file://{workdir}/rendezvous")
    assert results == {0: True, 1: True}
