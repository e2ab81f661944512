"""Render the scheduler Deployment: the pod-template annotation that restarts it when needed.

Volcano reads the device-config ConfigMap (the keys in `device_config.SCHEDULER_KEYS`),
`VGPUEnable` (device registration) and the `KnownGeometriesCMName/Namespace` arguments once per
process. `vgpu.io/scheduler-config-hash`
hashes exactly those inputs; a new value rolls the scheduler. Everything else in the Deployment
is left alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vgpu_operator.render import device_config, scheduler_conf
from vgpu_operator.render.inputs import InputError, check_workload, describe, short_hash
from vgpu_operator.render.target import TargetRender, failed_target, missing_target, workload_target

if TYPE_CHECKING:
    from vgpu_operator.view import ClusterView

ANNOTATION = "vgpu.io/scheduler-config-hash"


def desired_inputs(view: ClusterView) -> dict[str, Any]:
    return {"deviceConfig": device_config.scheduler_reads(device_config.desired_config(view)),
            **scheduler_conf.restart_arguments(scheduler_conf.desired_arguments(view.spec))}


def live_inputs(view: ClusterView) -> dict[str, Any] | None:
    arguments = scheduler_conf.live_arguments(view)
    if arguments is None:
        return None
    return {"deviceConfig": device_config.scheduler_reads(view.live_device_config),
            **scheduler_conf.restart_arguments(arguments)}


def render_scheduler_deployment_target(view: ClusterView) -> TargetRender:
    sched = view.spec.scheduler
    live = view.scheduler_deployment
    if live is None:
        return missing_target("Deployment", sched.namespace, sched.deployment, "spec.scheduler.deployment",
                              "SchedulerDeploymentNotFound",
                              "the operator cannot restart the scheduler after a device-config change: "
                              "set spec.scheduler.deployment to the scheduler's Deployment", "warning")
    try:
        where = describe("Deployment", sched.namespace, sched.deployment)
        check_workload(live, where, "spec.scheduler.deployment")
    except InputError as err:
        return failed_target("Deployment", sched.namespace, sched.deployment, live, err.problem)
    wanted = desired_inputs(view)
    return workload_target("Deployment", live, ANNOTATION, short_hash(wanted),
                           live_inputs(view) != wanted, running=view.running)
