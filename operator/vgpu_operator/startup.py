"""What `vgpu-operator` says when it cannot run: one line naming the problem and the fix.

Anything that ends the process is, in practice, a startup failure (kopf retries everything once
the operator runs): no kubeconfig, a broken one, an API server that cannot be reached or refuses
the credentials, a port in use. `describe` turns each into one line; `main` prints it with
`cli.fail`, a traceback only at --log-level debug.
"""

from __future__ import annotations

import errno
import os
import socket
from typing import NoReturn

import aiohttp
import kopf
from vgpu_formats import cli, kubeconfig
from vgpu_formats.kubeapi import ApiException

from vgpu_operator.k8s import describe_error
from vgpu_operator.metrics import Metrics
from vgpu_operator.settings import OperatorSettings


class StartupError(RuntimeError):
    """A failure whose message is already the one line to print."""


def serve_metrics(metrics: Metrics, port: int) -> None:
    """The Prometheus endpoint; a port in use says which flag to change."""
    try:
        metrics.serve(port)
    except OSError as exc:
        raise StartupError(f"--metrics-port {port}: {exc.strerror or exc}; pick a free port "
                           f"(0 disables the endpoint)") from exc


def check_port(flag: str, port: int) -> None:
    """Fail now if kopf's liveness endpoint could not listen on `port`: kopf would log its own
    traceback for it, after the operator had started."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds it
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as exc:
            raise StartupError(f"{flag} {port}: {exc.strerror or exc}; pick a free port "
                               f"(0 disables the endpoint)") from exc


def describe(exc: BaseException, settings: OperatorSettings, server: str | None) -> str:
    """One line for a failure that stopped the operator; `server`: the kubeconfig's, if read."""
    where = server or _in_cluster_server()
    source = f"kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "the in-cluster service account"
    if isinstance(exc, kubeconfig.KubeconfigError | StartupError):
        return str(exc)
    if isinstance(exc, aiohttp.ClientConnectionError):
        number = getattr(exc, "errno", None)
        reason = os.strerror(number) if isinstance(number, int) and number else str(exc) or type(exc).__name__
        return f"cannot reach the API server {where} ({reason}); check the server in {source} and the network"
    if isinstance(exc, TimeoutError):
        return (f"the API server {where} did not answer ({exc or 'timeout'}); check the network, or raise "
                f"--api-timeout")
    if isinstance(exc, ApiException):
        hints = {401: f"the credentials in {source} were refused",
                 403: "the operator's RBAC does not allow it (see the chart's ClusterRole)"}
        hint = hints.get(exc.status or 0)
        return f"API server {where}: {describe_error(exc)}" + (f"; {hint}" if hint else "")
    if isinstance(exc, kopf.LoginError):
        return f"cannot log in to the API server {where} with {source}: {exc}"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        # The metrics port is checked before the operator starts: this is kopf's liveness endpoint.
        return (f"--liveness-port {settings.liveness_port}: address already in use; pick a free port "
                f"(0 disables the endpoint)")
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _in_cluster_server() -> str:
    host = os.environ.get(kubeconfig.IN_CLUSTER_ENV, "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    return f"https://{host}:{port}" if host else "(unknown)"


def fail(message: str, exc: BaseException | None = None, log_format: str = "text") -> NoReturn:
    cli.fail("vgpu-operator", message, exc, log_format)
