"""Success rate per ALFWorld task type (Pick, Look, Clean, Heat, Cool, Pick2, All), as in the papers' tables."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from envs.alfworld.tasks import SHORT_NAMES, TASK_TYPES

__all__ = ["SuccessByTaskType", "success_by_task_type"]


@dataclass
class SuccessByTaskType:
    """Counts of episodes and wins per task type, fed with each episode's final info."""

    episodes: dict[str, int] = field(default_factory=dict)
    wins: dict[str, int] = field(default_factory=dict)

    def add(self, task_type: str, won: bool) -> None:
        if task_type not in SHORT_NAMES:
            raise ValueError(f"unknown task_type {task_type!r}; expected one of {TASK_TYPES}")
        self.episodes[task_type] = self.episodes.get(task_type, 0) + 1
        self.wins[task_type] = self.wins.get(task_type, 0) + int(bool(won))

    def add_info(self, info: Mapping) -> None:
        """Record one finished episode from its last info dict (needs ``task_type`` and ``won``)."""
        missing = [k for k in ("task_type", "won") if k not in info]
        if missing:
            raise KeyError(f"episode info lacks {missing}")
        self.add(info["task_type"], info["won"])

    def rates(self) -> dict[str, float]:
        """Success rate per short name for the task types seen, and ``All`` over every episode."""
        out = {SHORT_NAMES[t]: self.wins[t] / n for t in TASK_TYPES if (n := self.episodes.get(t, 0))}
        total = sum(self.episodes.values())
        if total:
            out["All"] = sum(self.wins.values()) / total
        return out

    def metrics(self, prefix: str = "success/") -> dict[str, float]:
        """Rates and episode counts as flat metric names, e.g. ``success/Pick`` and ``success/Pick_episodes``."""
        out = {f"{prefix}{name}": rate for name, rate in self.rates().items()}
        for t, n in self.episodes.items():
            out[f"{prefix}{SHORT_NAMES[t]}_episodes"] = float(n)
        return out


def success_by_task_type(final_infos: Iterable[Mapping]) -> dict[str, float]:
    """Success rate per task type and overall from the final info of each episode."""
    table = SuccessByTaskType()
    for info in final_infos:
        table.add_info(info)
    return table.rates()
