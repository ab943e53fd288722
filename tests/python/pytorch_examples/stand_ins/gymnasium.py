"""A stand-in for gymnasium (not in Debian) for the copies of pytorch/examples' RL programs:
CartPole-v1 with the classic cart-pole dynamics (Barto, Sutton and Anderson, 1983) and
gymnasium's API (reset -> (state, info), step -> (state, reward, terminated, truncated, info)).
The episode is solved at `TPD_EXAMPLES_REWARD_THRESHOLD` (gymnasium's 475 by default), so a
test can end the programs' train-until-solved loops after a few episodes."""

import math
import os
import random

import numpy as np

_GRAVITY, _CART_MASS, _POLE_MASS, _HALF_POLE, _FORCE, _TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
_X_LIMIT, _THETA_LIMIT, _MAX_STEPS = 2.4, 12 * 2 * math.pi / 360, 500


class _Spec:
    def __init__(self):
        self.reward_threshold = float(os.environ.get("TPD_EXAMPLES_REWARD_THRESHOLD", "475"))


class CartPole:
    def __init__(self):
        self.spec = _Spec()
        self._random = random.Random()
        self._state = [0.0] * 4
        self._steps = 0

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._random.seed(seed)
        self._state = [self._random.uniform(-0.05, 0.05) for _ in range(4)]
        self._steps = 0
        return np.array(self._state, dtype=np.float32), {}

    def step(self, action):
        x, x_dot, theta, theta_dot = self._state
        force = _FORCE if action == 1 else -_FORCE
        cos, sin = math.cos(theta), math.sin(theta)
        total_mass = _CART_MASS + _POLE_MASS
        pole_moment = _POLE_MASS * _HALF_POLE
        temp = (force + pole_moment * theta_dot ** 2 * sin) / total_mass
        theta_acc = (_GRAVITY * sin - cos * temp) / (
            _HALF_POLE * (4.0 / 3.0 - _POLE_MASS * cos ** 2 / total_mass))
        x_acc = temp - pole_moment * theta_acc * cos / total_mass
        self._state = [x + _TAU * x_dot, x_dot + _TAU * x_acc,
                       theta + _TAU * theta_dot, theta_dot + _TAU * theta_acc]
        self._steps += 1
        terminated = abs(self._state[0]) > _X_LIMIT or abs(self._state[2]) > _THETA_LIMIT
        truncated = self._steps >= _MAX_STEPS
        return np.array(self._state, dtype=np.float32), 1.0, terminated, truncated, {}


def make(name):
    if name != "CartPole-v1":
        raise ValueError(f"this stand-in for gymnasium has CartPole-v1 only, not {name}")
    return CartPole()
