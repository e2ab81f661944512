"""Finding and reading a kubeconfig the way kubectl users expect, with errors that name the fix.

Every command that talks to a cluster (`vgpu-operator`, `deviceplugin`, `vgpu-monitor`, `vgpuctl`)
finds its kubeconfig with `locate`: the `--kubeconfig` flag, else `$KUBECONFIG`, else
`~/.kube/config`, else the pod's service account. `read` turns the chosen context into a
`Connection` and says in one line what is missing when it cannot.

Unlike kubectl, several files in `$KUBECONFIG` are not merged: the first that exists is used.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vgpu_formats import yamlio

# Set by the kubelet in every pod: the service account is there to log in with.
IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


class KubeconfigError(ValueError):
    """No usable kubeconfig; the message is one line that names the file and the fix."""


@dataclass(frozen=True)
class Connection:
    """One context of a kubeconfig: where the API server is and how to log in. The secrets are
    left out of its repr: a Connection in a log line or a traceback must not leak them."""

    context: str
    server: str
    namespace: str | None = None
    ca_path: str | None = None
    ca_data: bytes | None = None
    insecure: bool = False
    token: str | None = field(default=None, repr=False)
    # The tokenFile the token was read from: a long-running client re-reads it (tokens rotate).
    token_path: str | None = None
    certificate_path: str | None = None
    certificate_data: bytes | None = field(default=None, repr=False)
    key_path: str | None = None
    key_data: bytes | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    # exec plugins and auth providers (cloud logins) are left to the client library.
    external_login: bool = False


def locate(explicit: str | None, environ: Mapping[str, str] | None = None,
           home: Path | None = None) -> Path | None:
    """The kubeconfig to use; None means the pod's service account."""
    environ = os.environ if environ is None else environ
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise KubeconfigError(f"--kubeconfig {explicit}: no such file")
        return path
    listed = environ.get("KUBECONFIG", "")
    if listed:
        for entry in filter(None, listed.split(os.pathsep)):
            if Path(entry).expanduser().is_file():
                return Path(entry).expanduser()
        raise KubeconfigError(f"$KUBECONFIG={listed}: no such file; set it to a kubeconfig or unset it")
    default = (home or Path.home()) / ".kube" / "config"
    if default.is_file():
        return default
    if environ.get(IN_CLUSTER_ENV):
        return None
    raise KubeconfigError(f"no kubeconfig: pass --kubeconfig PATH or set $KUBECONFIG ({default} does not "
                          f"exist, and this is not a pod)")


def read(path: Path, context: str | None = None, *, allow_context_flag: bool = False) -> Connection:
    """The named context (default: current-context) of the kubeconfig at `path`."""
    try:
        config = yamlio.load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise KubeconfigError(f"kubeconfig {path}: {exc.strerror or exc}") from exc
    except (yaml.YAMLError, ValueError) as exc:  # yamlio.load raises YAMLError for bad syntax
        raise KubeconfigError(f"kubeconfig {path}: {yamlio.describe(exc)}") from exc
    if not isinstance(config, dict) or not any(k in config for k in ("clusters", "contexts", "users")):
        raise KubeconfigError(f"kubeconfig {path}: not a kubeconfig (no clusters, contexts or users)")
    name = context or str(config.get("current-context") or "")
    if not name:
        # Only vgpuctl has --context; a daemon's kubeconfig must name its context itself.
        raise KubeconfigError(f"kubeconfig {path}: no current-context; run `kubectl config use-context NAME`"
                              f"{' or pass --context NAME' if allow_context_flag else ''}")
    ctx = _named(config, "contexts", name, path)
    cluster = _named(config, "clusters", str(ctx.get("cluster") or ""), path, f"context {name!r}")
    user = _named(config, "users", str(ctx.get("user") or ""), path, f"context {name!r}") \
        if ctx.get("user") else {}
    server = str(cluster.get("server") or "")
    if not server:
        raise KubeconfigError(f"kubeconfig {path}: cluster {ctx.get('cluster')!r} has no server")
    folder = path.parent
    token = user.get("token")
    token_file: Path | None = None
    if not token and user.get("tokenFile"):
        token_file = _relative(folder, user["tokenFile"])
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise KubeconfigError(f"kubeconfig {path}: tokenFile {token_file}: "
                                  f"{exc.strerror or exc}") from exc
    return Connection(
        context=name, server=server, namespace=ctx.get("namespace"),
        ca_path=_path(folder, cluster.get("certificate-authority")),
        ca_data=_data(cluster, "certificate-authority-data", path),
        insecure=bool(cluster.get("insecure-skip-tls-verify")),
        token=token, token_path=str(token_file) if token_file else None,
        certificate_path=_path(folder, user.get("client-certificate")),
        certificate_data=_data(user, "client-certificate-data", path),
        key_path=_path(folder, user.get("client-key")),
        key_data=_data(user, "client-key-data", path),
        username=user.get("username"), password=user.get("password"),
        external_login=bool(user.get("exec") or user.get("auth-provider")),
    )


def _named(config: dict[str, Any], section: str, name: str, path: Path, where: str = "") -> dict[str, Any]:
    entries = [e for e in config.get(section) or [] if isinstance(e, dict)]
    for entry in entries:
        if entry.get("name") == name:
            return dict(entry.get(section[:-1]) or {})
    known = ", ".join(str(e.get("name")) for e in entries) or "none"
    via = f" (named by {where})" if where else ""
    raise KubeconfigError(f"kubeconfig {path}: no {section[:-1]} named {name!r}{via}; it has: {known}")


def _relative(folder: Path, value: str) -> Path:
    # kubectl resolves relative file references against the kubeconfig's own folder.
    return (folder / Path(value).expanduser()).resolve()


def _path(folder: Path, value: Any) -> str | None:
    return str(_relative(folder, str(value))) if value else None


def _data(section: dict[str, Any], key: str, path: Path) -> bytes | None:
    value = section.get(key)
    if not value:
        return None
    try:
        # kubectl accepts the data line-wrapped (as `base64` writes it): whitespace is not data.
        return base64.b64decode("".join(str(value).split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KubeconfigError(f"kubeconfig {path}: {key} is not base64") from exc
