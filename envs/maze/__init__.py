"""The built-in maze: a fast multi-turn text environment for CPU learning checks.

``MazeEnv({"difficulty": "hard"})`` plays the key maze of ``envs.maze.key_layout``.
"""

from envs.maze.env import MazeEnv
from envs.maze.prompts import FIRST_PROMPT_TEMPLATE, PROMPT_TEMPLATE

__all__ = ["FIRST_PROMPT_TEMPLATE", "PROMPT_TEMPLATE", "MazeEnv"]
