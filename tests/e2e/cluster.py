"""Talking to the real control plane of `e2e.controlplane`: a JSON client, kubectl and helm,
ServiceAccount kubeconfigs, the audit log, and the operator run as a process under a token."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import aiohttp

from e2e import controlplane
from e2e.controlplane import State
from tests.support.api import Api
from tests.support.k8s_tools import ensure_tools

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Cluster:
    """The real cluster as its admin sees it (kubectl, helm, raw JSON)."""

    def __init__(self, state: State) -> None:
        self.state = state
        tools = ensure_tools()
        self.kubectl_bin, self.helm_bin = str(tools["kubectl"]), str(tools["helm"])
        helm_home = str(ROOT / ".e2e" / "helm")  # nothing of the user's helm repos or cache
        self.env = {**os.environ, "KUBECONFIG": state.kubeconfig, "HELM_CACHE_HOME": helm_home,
                    "HELM_CONFIG_HOME": helm_home, "HELM_DATA_HOME": helm_home}

    def run(self, binary: str, *args: str, check: bool = True,
            stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([binary, *args], capture_output=True, text=True, input=stdin,
                                env=self.env, timeout=180)
        if check and result.returncode != 0:
            raise AssertionError(f"{pathlib.Path(binary).name} {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout}\n{result.stderr}")
        return result

    def kubectl(self, *args: str, check: bool = True,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.run(self.kubectl_bin, *args, check=check, stdin=stdin)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(self.helm_bin, *args, check=check)

    def wait_established(self, crd_name: str, patience_s: float = 60) -> None:
        """Until the server serves crd_name. Polled rather than `kubectl wait
        --for=condition=Established`: that fails at once, instead of waiting, while the server has
        not written `.status.conditions` yet (`accessor error: <nil> is of the type <nil>`, seen
        in CI against the oldest release)."""
        established = '{.status.conditions[?(@.type=="Established")].status}'
        deadline = time.monotonic() + patience_s
        while True:
            got = self.kubectl("get", f"crd/{crd_name}", "-o", f"jsonpath={established}", check=False)
            if got.returncode == 0 and got.stdout.strip() == "True":
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"crd/{crd_name} not Established after {patience_s} s: "
                                     f"{got.stdout.strip()!r} {got.stderr.strip()}")
            time.sleep(0.2)

    def api(self, session: aiohttp.ClientSession) -> Api:
        """The raw JSON API as the admin (for what kubectl cannot time or stream)."""
        return Api(session, self.state.server, controlplane.admin_context(self.state))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        args = ["get", kind, name, "-o", "json"] + (["-n", namespace] if namespace else [])
        result = self.kubectl(*args, check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        found: dict[str, Any] = json.loads(result.stdout)
        return found

    def data(self, configmap: str, namespace: str, key: str) -> str:
        """A ConfigMap's key, "" when the ConfigMap or the key is missing."""
        found = self.get("configmap", configmap, namespace) or {}
        return str((found.get("data") or {}).get(key, ""))

    def items(self, kind: str, namespace: str | None = None,
              selector: str | None = None) -> list[dict[str, Any]]:
        args = ["get", kind, "-o", "json"] + (["-n", namespace] if namespace else ["-A"])
        if selector:
            args += ["-l", selector]
        listed: list[dict[str, Any]] = json.loads(self.kubectl(*args).stdout)["items"]
        return listed

    def namespace(self, prefix: str) -> str:
        """A fresh namespace (the tests share one server, so none reuses another's objects)."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", name)
        return name

    def ensure_namespace(self, name: str) -> None:
        if self.get("namespace", name) is None:
            self.kubectl("create", "namespace", name)

    def token(self, service_account: str, namespace: str, bound_pod: str | None = None) -> str:
        """A TokenRequest token of the ServiceAccount; `bound_pod`: bound to that pod of
        `namespace`, as the kubelet's projected token is (see `token_kubeconfig`)."""
        bound = ["--bound-object-kind=Pod", f"--bound-object-name={bound_pod}"] if bound_pod else []
        return self.kubectl("create", "token", service_account, "-n", namespace, "--duration=2h",
                            *bound).stdout.strip()

    def token_kubeconfig(self, service_account: str, namespace: str, path: pathlib.Path,
                         bound_pod: str | None = None) -> pathlib.Path:
        """A kubeconfig that authenticates as the ServiceAccount (a TokenRequest token, as the
        kubelet would mount into its pod): the operator runs with the chart's RBAC, not admin.
        `bound_pod`: bound to that pod of `namespace`, as the kubelet's projected token is (the
        server then names the pod's node in the user's extra, which the device plugin's
        admission policy requires)."""
        token = self.token(service_account, namespace, bound_pod)
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "sa",
            "clusters": [{"name": "e2e", "cluster": {"server": self.state.server,
                                                      "certificate-authority": self.state.ca}}],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": "sa"}}],
        }))
        return path

    def audit(self, user: str | None = None, since: float = 0.0) -> list[dict[str, Any]]:
        """Audit events (ResponseComplete) after `since` (a time.time()), optionally of one user.
        The log is flushed in batches of at most a second: callers wait for what they expect."""
        found: list[dict[str, Any]] = []
        path = pathlib.Path(self.state.audit_log)
        if not path.exists():
            return found
        with path.open() as log:
            for line in log:
                event = json.loads(line)
                if event.get("stage") != "ResponseComplete":
                    continue
                if user and event.get("user", {}).get("username") != user:
                    continue
                if since and _epoch(event["requestReceivedTimestamp"]) < since:
                    continue
                found.append(event)
        return found


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


@contextmanager
def operator_process(kubeconfig: pathlib.Path, log: pathlib.Path,
                     *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """`vgpu-operator ARGS` as a local process (there is no kubelet to run its pod)."""
    args = (sys.executable, "-m", "vgpu_operator.main", "--kubeconfig", str(kubeconfig), *args)
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
