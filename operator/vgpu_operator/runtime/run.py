"""`run_operator`: one operator run, in a Pod (`vgpu-operator`), a test or `vgpuctl demo`.

kopf runs through `spawn_tasks` + `run_tasks` with a stop flag (docs/upstream.md §7.2), beside our
own tasks: the worker, the node follower and the target follower. The run ends when the flag is
set; only the tasks this run spawned are cancelled (`runtime.tasks`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import kopf
from vgpu_formats import kubeconfig
from vgpu_formats.kubeapi import ApiException

from vgpu_operator import crd, logs
from vgpu_operator.k8s import CLUSTER_EVENTS_NAMESPACE, DEFAULT_TIMEOUT, Kube, Retry, new_api_client
from vgpu_operator.metrics import Metrics
from vgpu_operator.reconcile import Reconciler
from vgpu_operator.runtime import nodes, targets
from vgpu_operator.runtime.handlers import register
from vgpu_operator.runtime.tasks import RUN, Complement, SpawnedTasks
from vgpu_operator.runtime.worker import Tuning, Worker
from vgpu_operator.settings import configure_kopf

logger = logging.getLogger("vgpu_operator")


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
    reconciler = Reconciler(kube, metrics, nodes_timeout=tuning.nodes_timeout_seconds)
    worker = Worker(reconciler, metrics, tuning)
    registry = kopf.OperatorRegistry()
    register(registry, reconciler, worker)

    @kopf.on.startup(registry=registry, id="configure")
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, api_timeout)

    @kopf.on.login(registry=registry, id="login")
    async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if kubeconfig:
            return connection_from_kubeconfig(kubeconfig)
        return events_where_accepted(kopf.login_with_service_account(**kwargs))

    # Our own workers first, outside the run's mark: they stop with the flag, not by kopf's cancelling.
    ours = [asyncio.create_task(worker.run(stop_flag), name="vgpu-operator reconciler"),
               asyncio.create_task(nodes.follow(kube, reconciler.nodes, worker.trigger, stop_flag),
                                   name="vgpu-operator nodes"),
               asyncio.create_task(targets.follow(kube, reconciler.policies, worker.trigger, stop_flag),
                                   name="vgpu-operator targets")]
    spawned = SpawnedTasks()
    loop = asyncio.get_running_loop()
    spawned.install(loop)
    token = RUN.set(spawned)
    try:
        tasks = await kopf.spawn_tasks(
            registry=registry, clusterwide=not namespaces, namespaces=list(namespaces),
            standalone=peering is None, peering_name=peering, priority=priority,
            liveness_endpoint=f"http://0.0.0.0:{liveness_port}/healthz" if liveness_port else None,
            stop_flag=stop_flag, ready_flag=ready_flag,
            identity=cast(Any, identity),  # kopf's Identity is a NewType of str; None: detect
        )
        try:
            await kopf.run_tasks(tasks, ignored=Complement(spawned))
        finally:
            for task in ours:
                task.cancel()
            await asyncio.gather(*ours, return_exceptions=True)
    finally:
        RUN.reset(token)
        spawned.uninstall(loop)
        await kube.close()
    return reconciler
