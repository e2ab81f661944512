"""`ClusterView`: what one reconcile knows, each fact decided once.

The observed objects (`Observed`, as read from the API or picked out of manifests), the policy's
spec and the status it last stored, plus the facts every renderer and rule derives from them: the
plugin generation, the Volcano version, the scheduler conf and device-config as their readers
parse them, the restarts an interrupted reconcile announced, and the restart hashes the workloads'
pods run with. Each is computed on first use and kept, so a reconcile parses a 1 MiB ConfigMap
once however many renderers and rules read it.

Build it after every read is done: the facts are cached, the objects are not watched.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

from vgpu_formats import device_config as dc_fmt

from vgpu_operator import api, versions
from vgpu_operator.observed import Observed
from vgpu_operator.plan import Pending, Restart, pending_of, unfinished
from vgpu_operator.registry import ROLLOUTS, TARGETS, Rollout
from vgpu_operator.render.inputs import InputError, describe, parse_scheduler_conf


@dataclass(eq=False, kw_only=True)
class ClusterView(Observed):
    """The observed objects of one policy, with the facts derived from them."""

    spec: api.VGPUPolicySpec
    previous: api.VGPUPolicyStatus | None = None  # the policy's stored status (None: never reconciled)

    @classmethod
    def of(cls, observed: Observed, spec: api.VGPUPolicySpec,
           previous: api.VGPUPolicyStatus | None = None) -> ClusterView:
        if isinstance(observed, ClusterView) and observed.spec is spec and observed.previous is previous:
            return observed
        objects = {f.name: getattr(observed, f.name) for f in fields(Observed)}
        return cls(**objects, spec=spec, previous=previous)

    # ----- versions -----

    @cached_property
    def plugin(self) -> versions.PluginGeneration:
        """The device plugin generation the policy targets, from the spec or the image."""
        plugin = self.spec.device_plugin
        return versions.plugin_generation(plugin.generation, self.device_plugin, plugin.container)

    @property
    def generation(self) -> versions.Generation | None:
        return self.plugin.generation

    @cached_property
    def volcano(self) -> versions.VolcanoVersion:
        return versions.volcano_version(self.spec.scheduler.volcano_version, self.scheduler_deployment)

    # ----- parsed configs -----

    @cached_property
    def _scheduler_conf(self) -> dict[str, Any] | InputError:
        sched = self.spec.scheduler
        where = describe("ConfigMap", sched.namespace, sched.config_map)
        try:
            return parse_scheduler_conf(self.scheduler_conf_text(sched.key), where, sched.key)
        except InputError as err:
            return err

    def scheduler_conf(self) -> dict[str, Any]:
        """The live scheduler conf as data (do not modify: copy first). Raises InputError when it is
        missing or unusable, the same error every time."""
        conf = self._scheduler_conf
        if isinstance(conf, InputError):
            raise conf
        return conf

    @cached_property
    def live_device_config(self) -> dc_fmt.DeviceConfig | None:
        """The live device-config as its readers load it; None when missing or unreadable (the
        scheduler then uses its built-in defaults)."""
        return dc_fmt.load_device_config(self.device_config_text())

    # ----- restarts -----

    @cached_property
    def pending(self) -> Pending:
        """Restarts a reconcile announced on the ConfigMaps and did not finish (plan.Pending)."""
        return pending_of([getattr(self, t.slot) for t in TARGETS if t.kind == "ConfigMap"])

    @cached_property
    def _unfinished(self) -> tuple[list[str], list[Restart]]:
        workloads = [getattr(self, t.slot) for t in TARGETS if isinstance(t.restart, Rollout)]
        return unfinished(self.pending, workloads)

    @property
    def to_roll(self) -> list[str]:
        """Workloads (refs) an interrupted reconcile announced and did not roll."""
        return self._unfinished[0]

    @property
    def rolled(self) -> list[Restart]:
        """Rollouts an interrupted reconcile announced and did make."""
        return self._unfinished[1]

    @cached_property
    def running(self) -> dict[str, str | None]:
        """Workload ref -> the restart hash its pods run with, as the stored status last recorded it
        (InSync: matched; Updated: written, pods rolling). A workload the operator adopted without
        a restart has no annotation, so this is how a later drift of its inputs (a hand edit the
        operator repairs) is told apart from a change the pods have not seen. None: an apply that
        should have rolled it failed (status state Error) or was interrupted (`to_roll`), possibly
        after writing its inputs, so its pods run with something else than the live inputs say."""
        recorded: dict[str, str | None] = {}
        for t in self.previous.targets if self.previous else []:
            if t.kind in ROLLOUTS and (t.state == "Error" or (t.hash and t.state in ("InSync", "Updated"))):
                recorded[describe(t.kind, t.namespace, t.name)] = None if t.state == "Error" else t.hash
        recorded.update(dict.fromkeys(self.to_roll))
        return recorded


def view_of(observed: Observed, policy: api.VGPUPolicy | api.VGPUPolicySpec) -> ClusterView:
    """The view of `observed` for a policy (its stored status included) or a bare spec."""
    if isinstance(policy, api.VGPUPolicy):
        return ClusterView.of(observed, policy.spec, policy.status)
    return ClusterView.of(observed, policy)
