"""An RL-style agent with observers, written for torch.distributed.rpc; on tpd by its import.

    python3 rl_observer_agent.py --rank R --world_size N      (rank 0 is the agent)

The agent owns the policy. Each observer runs episodes in its own toy environment and asks the
agent for an action at every step; the agent batches the requests of all observers into one
policy evaluation: `select_action` is an @rpc.functions.async_execution function that returns
a future, answered when the batch is full, so no agent thread waits while requests gather.
"""

import argparse
import threading

import torch

import tpd.rpc as rpc  # was: import torch.distributed.rpc as rpc

AGENT = "agent"


class Agent:
    def __init__(self, observers):
        torch.manual_seed(0)
        self.policy = torch.nn.Linear(4, 2)
        self.observers = observers
        self.lock = threading.Lock()
        self.waiting = []  # (state, future) of this step
        self.rewards = {}

    @staticmethod
    @rpc.functions.async_execution
    def select_action(agent_rref, observer, state):
        self = agent_rref.local_value()
        future = torch.futures.Future()
        with self.lock:
            self.waiting.append((state, future))
            if len(self.waiting) == self.observers:
                batch, self.waiting = self.waiting, []
                with torch.no_grad():
                    actions = self.policy(torch.stack([s for s, _ in batch])).argmax(1)
                for (_, f), action in zip(batch, actions.tolist()):
                    f.set_result(action)
        return future

    def report(self, observer, reward):
        with self.lock:
            self.rewards[observer] = reward


def run_observer(agent_rref, observer, steps):
    torch.manual_seed(observer)
    state = torch.randn(4)
    total = 0.0
    for _ in range(steps):
        action = rpc.rpc_sync(AGENT, Agent.select_action, args=(agent_rref, observer, state))
        total += 1.0 if action == int(state.sum() > 0) else 0.0
        state = torch.randn(4)
    agent_rref.rpc_sync().report(observer, total)
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world_size", type=int, required=True)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    name = AGENT if args.rank == 0 else f"observer{args.rank}"
    rpc.init_rpc(name, rank=args.rank, world_size=args.world_size)
    if args.rank == 0:
        agent_rref = rpc.RRef(Agent(args.world_size - 1))
        futures = [rpc.rpc_async(f"observer{r}", run_observer, args=(agent_rref, r, args.steps))
                   for r in range(1, args.world_size)]
        totals = torch.futures.wait_all(futures)
        agent = agent_rref.local_value()
        assert sorted(agent.rewards) == list(range(1, args.world_size)), agent.rewards
        print(f"agent: {len(totals)} observers x {args.steps} steps, batched; rewards "
              + ", ".join(f"{t:.0f}" for t in totals))
    rpc.shutdown()


if __name__ == "__main__":
    main()
