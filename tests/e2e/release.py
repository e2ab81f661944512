"""A release of the chart on the real server, and the operator running under the chart's
ServiceAccount (a TokenRequest token, not admin), with the arguments the chart's Deployment gives it.

There is no kubelet: the operator runs as a local process instead of in its pod, and the fixture
nodes carry the registration annotation a device plugin would have written.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.support.waiting import eventually_sync

from .cluster import ROOT, Cluster, operator_process, service_account_user

CHART = ROOT / "charts" / "vgpu-operator"
FIXTURES = ROOT / "tests" / "fixtures" / "cluster"
RELEASE = "vgpu"
OPERATOR_SA = f"{RELEASE}-vgpu-operator"
PLUGIN_SA = f"{OPERATOR_SA}-device-plugin"
SCHEDULER_NS = "volcano-system"


def volcano(cluster: Cluster) -> None:
    """The fixture cluster's Volcano scheduler (ConfigMap as upstream ships it, Deployment) and its
    two GPU nodes, reset to the fixture's state (status too: `apply` would keep a status an
    earlier test published)."""
    cluster.ensure_namespace(SCHEDULER_NS)
    cluster.kubectl("replace", "--force", "-f", str(FIXTURES / "volcano-scheduler.yaml"))
    cluster.kubectl("replace", "--force", "-f", str(FIXTURES / "nodes.yaml"))
    # A new Node gets the not-ready taint at admission; the node lifecycle controller lifts it
    # once the kubelet reports Ready. There is no kubelet here: lift it as that controller would.
    cluster.kubectl("taint", "nodes", "--all", "node.kubernetes.io/not-ready:NoSchedule-", check=False)


def leftover_releases(cluster: Cluster) -> None:
    """Uninstall a release of ours that a killed run left on a control plane kept by
    `make e2e-up`: its cluster-wide objects would make every later install fail."""
    listed = json.loads(cluster.helm("list", "-A", "-f", f"^{RELEASE}$", "-o", "json").stdout or "[]")
    for found in listed:
        cluster.helm("uninstall", RELEASE, "-n", found["namespace"], "--wait", check=False)


def operator_args(cluster: Cluster, namespace: str) -> list[str]:
    """The operator container's arguments as the installed Deployment has them."""
    deployment = cluster.get("deployment", OPERATOR_SA, namespace)
    assert deployment is not None, "helm did not create the operator Deployment"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return list(container.get("args", []))


def condition(policy: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in (policy or {}).get("status", {}).get("conditions", []):
        if cond["type"] == type_:
            return dict(cond)
    return {}


@dataclass
class Release:
    """A helm release and the operator process its Deployment describes."""

    cluster: Cluster
    namespace: str
    tmp: pathlib.Path
    started: float = 0.0  # time.time() when the operator (last) started
    process: subprocess.Popen[bytes] | None = None
    _stack: ExitStack = field(default_factory=ExitStack)

    @property
    def user(self) -> str:
        return service_account_user(self.namespace, OPERATOR_SA)

    @property
    def log(self) -> pathlib.Path:
        return self.tmp / "operator.log"

    def start_operator(self, *extra: str) -> None:
        """Run the operator as the Deployment says now (args, ServiceAccount): what a rollout does
        (`extra` args appended, e.g. a shorter --resync for a bench)."""
        kubeconfig = self.cluster.token_kubeconfig(OPERATOR_SA, self.namespace,
                                                   self.tmp / "operator.kubeconfig")
        # Later flags win: no ports to bind on this machine, the rest exactly as the chart says.
        args = [*operator_args(self.cluster, self.namespace), "--liveness-port=0", "--metrics-port=0", *extra]
        self.started = time.time()
        self.process = self._stack.enter_context(operator_process(kubeconfig, self.log, *args))

    def stop_operator(self) -> None:
        self._stack.close()
        self.process = None

    def upgrade(self, *helm_args: str) -> None:
        """`helm upgrade`, then the operator pod replaced as the Deployment's rollout would."""
        self.cluster.helm("upgrade", RELEASE, str(CHART), "-n", self.namespace, "--reuse-values", *helm_args)
        self.stop_operator()
        self.start_operator()

    def policy(self) -> dict[str, Any] | None:
        return self.cluster.get("vgpupolicy", "default")

    def ready(self) -> dict[str, Any]:
        ready: dict[str, Any] = eventually_sync(
            lambda: (p := self.policy()) and condition(p, "Ready").get("status") == "True" and p,
            what=f"the default VGPUPolicy Ready (operator log: {self.log})")
        return ready


@contextmanager
def installed(cluster: Cluster, tmp: pathlib.Path, *helm_args: str) -> Iterator[Release]:
    """`helm install` into a fresh namespace, then the operator with the chart's args and RBAC.
    On the way out: the policy deleted while the operator still runs (its finalizer), then
    `helm uninstall` and the namespace deleted, as the chart README says."""
    volcano(cluster)
    leftover_releases(cluster)
    namespace = f"vgpu-e2e-{uuid.uuid4().hex[:6]}"
    cluster.helm("install", RELEASE, str(CHART), "-n", namespace, "--create-namespace", *helm_args)
    release = Release(cluster, namespace, tmp)
    try:
        release.start_operator()
        yield release
        assert release.process is not None and release.process.poll() is None, \
            f"the operator exited; see {release.log}"
    finally:
        try:
            # Deleted while the operator runs, which removes its finalizer; if it cannot (a failed
            # test), the finalizer goes by hand so no later test meets a policy stuck in deletion.
            cluster.kubectl("delete", "vgpupolicy", "--all", "--wait=true", "--timeout=30s", check=False)
            stuck = cluster.kubectl("get", "vgpupolicies", "-o", "name", check=False).stdout.split()
            for name in stuck:
                cluster.kubectl("patch", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                                check=False)
        finally:
            release.stop_operator()  # never left running to fight a later test's operator
            cluster.helm("uninstall", RELEASE, "-n", namespace, "--wait", check=False)
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
