"""A stand-in for gymnasium, for the real-script bench only (bench/real_scripts.py).

The RL scripts of the bench need two classic-control environments and nothing else: this offers
`make("CartPole-v1")` and `make("Pendulum-v1")` with the real observation and action shapes,
the new step API (`obs, reward, terminated, truncated, info`) and textbook physics written out
here, so that episodes end and rewards vary as they would. Never used by torchls.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__version__ = "0.0+bench-stub"


class _Spec:
    def __init__(self, name: str, reward_threshold: float, max_episode_steps: int) -> None:
        self.id = name
        self.reward_threshold = reward_threshold
        self.max_episode_steps = max_episode_steps


class _Env:
    spec: _Spec

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self.rng = np.random.default_rng(0)
        self.steps = 0

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.steps = 0
        self._start()
        return self._observation(), {}

    def render(self) -> None:
        return None

    def close(self) -> None:
        return None

    def _start(self) -> None:
        raise NotImplementedError

    def _observation(self) -> np.ndarray:
        raise NotImplementedError


class CartPole(_Env):
    """Cart-pole balancing (Barto, Sutton and Anderson, 1983): push left (0) or right (1)."""

    spec = _Spec("CartPole-v1", 475.0, 500)

    def _start(self) -> None:
        self.state = self.rng.uniform(-0.05, 0.05, size=4)

    def _observation(self) -> np.ndarray:
        return self.state.astype(np.float32)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        x, speed, angle, spin = self.state
        force = 10.0 if int(action) == 1 else -10.0
        cos, sin = math.cos(angle), math.sin(angle)
        pole_mass, total_mass, half_length, tau = 0.1, 1.1, 0.5, 0.02
        push = (force + pole_mass * half_length * spin * spin * sin) / total_mass
        spin_rate = (9.8 * sin - cos * push) / (
            half_length * (4.0 / 3.0 - pole_mass * cos * cos / total_mass)
        )
        rate = push - pole_mass * half_length * spin_rate * cos / total_mass
        self.state = np.array(
            [x + tau * speed, speed + tau * rate, angle + tau * spin, spin + tau * spin_rate]
        )
        self.steps += 1
        terminated = bool(abs(self.state[0]) > 2.4 or abs(self.state[2]) > 0.2095)
        truncated = self.steps >= self.spec.max_episode_steps
        return self._observation(), 1.0, terminated, truncated, {}


class Pendulum(_Env):
    """Swing a pendulum up: one torque in [-2, 2]; observation (cos, sin, angular speed)."""

    spec = _Spec("Pendulum-v1", -200.0, 200)

    def _start(self) -> None:
        self.angle = float(self.rng.uniform(-math.pi, math.pi))
        self.speed = float(self.rng.uniform(-1.0, 1.0))

    def _observation(self) -> np.ndarray:
        return np.array([math.cos(self.angle), math.sin(self.angle), self.speed], np.float32)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        torque = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -2.0, 2.0))
        wrapped = (self.angle + math.pi) % (2 * math.pi) - math.pi
        cost = wrapped**2 + 0.1 * self.speed**2 + 0.001 * torque**2
        self.speed = float(
            np.clip(self.speed + (15.0 * math.sin(self.angle) + 3.0 * torque) * 0.05, -8, 8)
        )
        self.angle += self.speed * 0.05
        self.steps += 1
        return self._observation(), -cost, False, self.steps >= self.spec.max_episode_steps, {}


_ENVIRONMENTS = {"CartPole": CartPole, "Pendulum": Pendulum}


def make(name: str, render_mode: str | None = None, **kwargs: Any) -> _Env:
    kind = _ENVIRONMENTS.get(name.split("-")[0])
    if kind is None:
        raise ValueError(f"the bench stub has no environment {name!r}")
    return kind(render_mode)
