"""`vgpu-operator`: the process entry point, and `run_operator` for in-process use (tests, demo).

kopf runs through `spawn_tasks` + `run_tasks` with a stop flag (research: kopf-kmock.md), so the
same code serves a Pod in a cluster, a test against the emulator and `vgpuctl demo`.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import signal
import weakref
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import kopf
from kubernetes_asyncio.client.exceptions import ApiException
from vgpu_formats import kubeconfig

from vgpu_operator import crd, logs, nodes, startup, targets
from vgpu_operator.handlers import register
from vgpu_operator.k8s import CLUSTER_EVENTS_NAMESPACE, DEFAULT_TIMEOUT, Kube, Retry, new_api_client
from vgpu_operator.metrics import Metrics
from vgpu_operator.reconcile import Reconciler, Tuning
from vgpu_operator.settings import OperatorSettings, configure_kopf, parse_args

logger = logging.getLogger("vgpu_operator")

class _SpawnedTasks:
    """The tasks one operator run spawned: created while `_RUN` is this object (a task is created
    in its creator's context), recorded by a task factory.

    kopf's `run_tasks` cancels, on exit, every task it is not told to ignore; in a shared event
    loop (tests, `vgpuctl demo`) that includes the caller's and the emulator's tasks, so what it
    ignores is the complement (`_Complement`): everything this run did not spawn. Several runs may
    share a loop (two HA replicas in one test), so one factory per loop serves every run, and it
    is removed with the last one."""

    def __init__(self) -> None:
        self.tasks: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        runs = _LOOP_RUNS.get(loop)
        if runs is None:
            runs = _LOOP_RUNS[loop] = _LoopRuns(loop.get_task_factory())
            loop.set_task_factory(runs.factory)
        runs.runs.add(self)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        runs = _LOOP_RUNS[loop]
        runs.runs.discard(self)
        if not runs.runs:
            loop.set_task_factory(runs.previous)
            del _LOOP_RUNS[loop]


_RUN: contextvars.ContextVar[_SpawnedTasks | None] = contextvars.ContextVar("vgpu_operator_run", default=None)


class _LoopRuns:
    """The runs sharing one event loop, and the task factory that records their tasks."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous
        self.runs: set[_SpawnedTasks] = set()

    def factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        previous = self.previous
        task = previous(loop, coro, **kwargs) if previous else asyncio.Task(coro, loop=loop, **kwargs)
        context = kwargs.get("context")
        run = context.get(_RUN) if context is not None else _RUN.get()
        if run in self.runs:  # None, or a run already over: not recorded
            run.tasks.add(task)
        return task


_LOOP_RUNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopRuns] = weakref.WeakKeyDictionary()


class _Complement(Collection["asyncio.Task[Any]"]):
    def __init__(self, spawned: _SpawnedTasks) -> None:
        self.spawned = spawned

    def __contains__(self, task: object) -> bool:
        return task not in self.spawned.tasks

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(())

    def __len__(self) -> int:
        return 0


def connection_from_kubeconfig(path: str) -> kopf.ConnectionInfo:
    """kopf credentials from a kubeconfig file (current context); KubeconfigError names what is
    missing. Exec plugins and auth providers are refused: kopf cannot run them."""
    found = kubeconfig.read(Path(path))
    if found.external_login:
        raise kubeconfig.KubeconfigError(
            f"kubeconfig {path}: context {found.context!r} logs in through an exec plugin or auth "
            f"provider, which the operator cannot run; use a token or client certificate")
    return kopf.ConnectionInfo(
        server=found.server, ca_path=found.ca_path, ca_data=found.ca_data, insecure=found.insecure,
        token=found.token, certificate_path=found.certificate_path, certificate_data=found.certificate_data,
        private_key_path=found.key_path, private_key_data=found.key_data,
        username=found.username, password=found.password,
        default_namespace=CLUSTER_EVENTS_NAMESPACE,
    )


def events_where_accepted(info: kopf.ConnectionInfo | None) -> kopf.ConnectionInfo | None:
    """kopf files Events about cluster-scoped objects in the connection's default namespace, which
    in-cluster login sets to the pod's: the API server refuses them there."""
    return dataclasses.replace(info, default_namespace=CLUSTER_EVENTS_NAMESPACE) if info else None


async def upgrade_crd(kube: Kube) -> None:
    """Bring the installed VGPUPolicy CRD up to the one this build generates (helm never upgrades
    crds/). Refused (the chart's operator.manageCRD off) or missing: say how to fix it, go on."""
    ours = crd.crd_manifest()
    try:
        installed = await kube.get("CustomResourceDefinition", None, crd.CRD_NAME)
    except ApiException as exc:
        logger.warning("could not read CRD %s (%s); not checking its version", crd.CRD_NAME, exc.status)
        return
    action = crd.upgrade_action(installed, ours)
    if action == "missing":
        logger.error("CRD %s is not installed: %s", crd.CRD_NAME, crd.CRD_FIX)
    elif action == "newer-installed":
        logger.warning("CRD %s was written by a newer operator; leaving it", crd.CRD_NAME)
    elif action == "update":
        try:
            # A merge patch replaces the versions list whole: the served schema becomes ours.
            update = {"metadata": {"annotations": ours["metadata"]["annotations"]}, "spec": ours["spec"]}
            await kube.patch("CustomResourceDefinition", None, crd.CRD_NAME, update)
            logs.action(logger, "updated", "CustomResourceDefinition", None, crd.CRD_NAME, "upgrade",
                        f"to revision {ours['metadata']['annotations'][crd.REVISION_ANNOTATION]}")
        except ApiException as exc:
            # Go on: the installed schema still serves the policy; what it lacks is pruned or
            # refused, so say it as an error, with the command that fixes it.
            logger.error("CRD %s is out of date and could not be updated (HTTP %s): %s", crd.CRD_NAME,
                         exc.status, crd.CRD_FIX_FORBIDDEN if exc.status == 403 else crd.CRD_FIX)


async def run_operator(
    kubeconfig: str | None,
    stop_flag: asyncio.Event,
    *,
    namespaces: Sequence[str] = (),
    peering: str | None = None,
    priority: int | None = None,
    liveness_port: int | None = None,
    metrics: Metrics | None = None,
    tuning: Tuning | None = None,
    ready_flag: asyncio.Event | None = None,
    retry: Retry | None = None,
    identity: str | None = None,
    api_timeout: float = DEFAULT_TIMEOUT,
) -> Reconciler:
    """Run the operator until `stop_flag` is set; returns the Reconciler (for inspection).
    `api_timeout`: the deadline of each API request, the operator's own and kopf's."""
    tuning = tuning or Tuning()
    metrics = metrics or Metrics()
    kube = Kube(await new_api_client(kubeconfig), retry, timeout=api_timeout)
    try:
        await upgrade_crd(kube)  # the first API call: an unreachable server ends the run here
    except BaseException:
        await kube.close()
        raise
    reconciler = Reconciler(kube, metrics, tuning)
    registry = kopf.OperatorRegistry()
    register(registry, reconciler)

    @kopf.on.startup(registry=registry, id="configure")
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, api_timeout)

    @kopf.on.login(registry=registry, id="login")
    async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if kubeconfig:
            return connection_from_kubeconfig(kubeconfig)
        return events_where_accepted(kopf.login_with_service_account(**kwargs))

    # Our own workers first, outside the run's mark: they stop with the flag, not by kopf's cancelling.
    workers = [asyncio.create_task(reconciler.run(stop_flag), name="vgpu-operator reconciler"),
               asyncio.create_task(nodes.follow(kube, reconciler.nodes, reconciler.trigger, stop_flag),
                                   name="vgpu-operator nodes"),
               asyncio.create_task(targets.follow(kube, reconciler.policies, reconciler.trigger, stop_flag),
                                   name="vgpu-operator targets")]
    spawned = _SpawnedTasks()
    loop = asyncio.get_running_loop()
    spawned.install(loop)
    token = _RUN.set(spawned)
    try:
        tasks = await kopf.spawn_tasks(
            registry=registry, clusterwide=not namespaces, namespaces=list(namespaces),
            standalone=peering is None, peering_name=peering, priority=priority,
            liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
            stop_flag=stop_flag, ready_flag=ready_flag,
            identity=cast(Any, identity),  # kopf's Identity is a NewType of str; None: detect
        )
        try:
            await kopf.run_tasks(tasks, ignored=_Complement(spawned))
        finally:
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
    finally:
        _RUN.reset(token)
        spawned.uninstall(loop)
        await kube.close()
    return reconciler


async def _serve(settings: OperatorSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    metrics = Metrics()
    if settings.liveness_port:
        startup.check_port("--liveness-port", settings.liveness_port)
    if settings.metrics_port:
        startup.serve_metrics(metrics, settings.metrics_port)
    await run_operator(settings.kubeconfig, stop, namespaces=settings.namespaces,
                       peering=settings.peering, priority=settings.priority,
                       liveness_port=settings.liveness_port, metrics=metrics,
                       tuning=Tuning(resync_seconds=settings.resync_seconds),
                       api_timeout=settings.api_timeout_seconds)


def main(argv: Sequence[str] | None = None) -> None:
    """Exit 1 with one `vgpu-operator: error: ...` line on any failure (usage errors: 2)."""
    settings = parse_args(argv)
    logs.configure(settings.log_level, settings.log_format)
    server: str | None = None
    try:
        located = kubeconfig.locate(settings.kubeconfig)
        if located is not None:  # read now: a broken kubeconfig is a one-line error, not a login retry loop
            server = connection_from_kubeconfig(str(located)).server
        settings = dataclasses.replace(settings, kubeconfig=str(located) if located else None)
        asyncio.run(_serve(settings))
    except Exception as exc:
        traced = exc if settings.log_level <= logging.DEBUG else None
        startup.fail(startup.describe(exc, settings, server), traced, settings.log_format)


if __name__ == "__main__":
    main()
