"""A parameter server with trainers, written for torch.distributed.rpc; on tpd by its import.

    python3 parameter_server.py --rank R --world_size N      (rank 0 is the server)

Each trainer holds an RRef to the server's model (remote), pulls parameters (rpc_sync through
the RRef's proxy), computes gradients on its own batch, and pushes them back; the server
averages what it received and steps. The job rendezvouses through env:// (MASTER_ADDR,
MASTER_PORT) as any torch job does.
"""

import argparse
import threading

import torch
import torch.nn as nn

import tpd.rpc as rpc  # was: import torch.distributed.rpc as rpc


class ParameterServer:
    def __init__(self, trainers):
        torch.manual_seed(0)
        self.model = nn.Linear(16, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.trainers = trainers
        self.lock = threading.Lock()
        self.pending = []
        self.steps = 0

    def parameters(self):
        with self.lock:
            return [p.detach().clone() for p in self.model.parameters()]

    def push_gradients(self, gradients):
        with self.lock:
            self.pending.append(gradients)  # the server keeps what it received
            if len(self.pending) < self.trainers:
                return self.steps
            for p, *grads in zip(self.model.parameters(), *self.pending):
                p.grad = torch.stack(grads).mean(0)
            self.optimizer.step()
            self.pending.clear()
            self.steps += 1
            return self.steps


def train(ps_rref, rank, rounds):
    torch.manual_seed(rank)
    true_w = torch.arange(16, dtype=torch.float32) / 16
    model = nn.Linear(16, 1)
    loss = None
    for _ in range(rounds):
        for p, value in zip(model.parameters(), ps_rref.rpc_sync().parameters()):
            p.data.copy_(value)
        x = torch.randn(64, 16)
        y = x @ true_w.unsqueeze(1)
        model.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        ps_rref.rpc_sync().push_gradients([p.grad for p in model.parameters()])
    return float(loss)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world_size", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    name = "ps" if args.rank == 0 else f"trainer{args.rank}"
    rpc.init_rpc(name, rank=args.rank, world_size=args.world_size)
    if args.rank == 0:
        ps_rref = rpc.RRef(ParameterServer(args.world_size - 1))
        futures = [rpc.rpc_async(f"trainer{r}", train, args=(ps_rref, r, args.rounds))
                   for r in range(1, args.world_size)]
        losses = [f.wait() for f in futures]
        print(f"parameter server: {ps_rref.local_value().steps} steps; trainers' last losses "
              + ", ".join(f"{loss:.4f}" for loss in losses))
        first = train(ps_rref, 0, 1)  # the trained model, checked on a fresh batch
        assert first < 0.5, f"the model did not learn (loss {first})"
    rpc.shutdown()


if __name__ == "__main__":
    main()
