"""ALFWorld on the real engine as a gymnasium text environment, with offline bundled games.

Importing this package does not import alfworld; the environment imports it when constructed.
"""

from envs.alfworld.metrics import SuccessByTaskType, success_by_task_type
from envs.alfworld.tasks import SHORT_NAMES, TASK_TYPES

__all__ = ["AlfworldEnv", "SHORT_NAMES", "TASK_TYPES", "SuccessByTaskType", "success_by_task_type"]


def __getattr__(name: str):
    if name == "AlfworldEnv":
        from envs.alfworld.env import AlfworldEnv

        return AlfworldEnv
    raise AttributeError(name)
