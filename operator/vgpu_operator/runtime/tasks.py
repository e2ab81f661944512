"""Which asyncio tasks belong to one operator run.

kopf's `run_tasks` cancels, on exit, every task it is not told to ignore; in a shared event loop
(tests, `vgpuctl demo`) that includes the caller's and the emulator's tasks. So each run records
the tasks it spawns (`SpawnedTasks`, via a task factory) and tells kopf to ignore the complement.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Collection, Iterator
from typing import Any


class SpawnedTasks:
    """The tasks one operator run spawned: created while `RUN` is this object (a task is created
    in its creator's context), recorded by a task factory. Several runs may share a loop (two HA
    replicas in one test), so one factory per loop serves every run, and it is removed with the
    last one."""

    def __init__(self) -> None:
        self.tasks: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        runs = _LOOPRUNS.get(loop)
        if runs is None:
            runs = _LOOPRUNS[loop] = _LoopRuns(loop.get_task_factory())
            loop.set_task_factory(runs.factory)
        runs.runs.add(self)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        runs = _LOOPRUNS[loop]
        runs.runs.discard(self)
        if not runs.runs:
            loop.set_task_factory(runs.previous)
            del _LOOPRUNS[loop]


RUN: contextvars.ContextVar[SpawnedTasks | None] = contextvars.ContextVar("vgpu_operator_run", default=None)


class _LoopRuns:
    """The runs sharing one event loop, and the task factory that records their tasks."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.runs: set[SpawnedTasks] = set()

    def factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        previous = self.previous
        task = previous(loop, coro, **kwargs) if previous else asyncio.Task(coro, loop=loop, **kwargs)
        context = kwargs.get("context")
        run = context.get(RUN) if context is not None else RUN.get()
        if run in self.runs:  # None, or a run already over: not recorded
            run.tasks.add(task)
        return task


_LOOPRUNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopRuns] = weakref.WeakKeyDictionary()


class Complement(Collection["asyncio.Task[Any]"]):
    def __init__(self, spawned: SpawnedTasks) -> None:
        self.spawned = spawned

    def __contains__(self, task: object) -> bool:
        return task not in self.spawned.tasks

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(())

    def __len__(self) -> int:
        return 0
