"""CUDA tensors by the group's device maps, through tpd.rpc and through torch's RPC module with
backend=TPD (two GPUs; skipped without)."""

import pytest
import torch

import rpc_workers
import scenarios

needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs two CUDA GPUs (run on the GPU machine: docs/python.md)")


# backend_cuda_maps adds what torch builds above its agent: RRefs of CUDA values, and a
# distributed backward pass whose gradients come back by the reverse map.
by_both_ways_in = pytest.mark.parametrize(
    "scenario", [scenarios.cuda_maps, scenarios.backend_cuda_maps], ids=["tpd.rpc", "backend"])


@needs_two_gpus
@by_both_ways_in
def test_cuda_tensors_follow_the_device_maps_on_one_node(daemon, workdir, scenario):
    results = rpc_workers.run(scenario, 2, [daemon.socket], f"file://{workdir}/rendezvous")
    assert results == {0: True, 1: True}


@needs_two_gpus
@by_both_ways_in
def test_cuda_tensors_follow_the_device_maps_across_two_daemons(two_daemons, workdir, scenario):
    results = rpc_workers.run(scenario, 2, [d.socket for d in two_daemons],
                              f"file://{workdir}/rendezvous")
    assert results == {0: True, 1: True}
