"""A simulated OpenRouter: the stand-in for the real API in the demo, tests and benchmarks."""

from regen.sim.config import SimConfig, SimEndpoint, SimModel, load_sim_config
from regen.sim.server import RunningSim, Simulator, sim_in_thread, start_sim

__all__ = [
    "RunningSim",
    "SimConfig",
    "SimEndpoint",
    "SimModel",
    "Simulator",
    "load_sim_config",
    "sim_in_thread",
    "start_sim",
]
