"""The one Kubernetes API transport of the operator, the device plugin and vgpuctl: aiohttp and
JSON dicts, logged in from a `vgpu_formats.kubeconfig.Connection` or the pod's service account.

Small on purpose: the generated kubernetes client costs tens of MiB of RSS and kopf imports it
whenever it is installed. Every call has a deadline. A plain call (`request`) has `timeout` for
all of it: connect, send, headers and body. A watch (`stream`) must get its headers within
`timeout`, ends at timeoutSeconds + WATCH_SLACK whatever happens, and fails when no byte arrives
for `read_timeout` (a server or a path that hangs mid-stream), so nothing waits forever.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import ssl
import subprocess
import sys
import tempfile
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from vgpu_formats import kubeconfig, yamlio

DEFAULT_TIMEOUT = 30.0  # seconds for one plain call
CONNECT_TIMEOUT = 10.0  # seconds to open a connection (never more than the call's own deadline)
WATCH_SLACK = 30.0  # a watch asked to end after timeoutSeconds is cut this much later
# The API server's watch cache sends a BOOKMARK about once a minute on a watch that asked for
# them (every watch here does): this much silence means the stream is dead, not quiet.
WATCH_READ_TIMEOUT = 150.0
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
JSON = "application/json"
Query = Mapping[str, str] | Sequence[tuple[str, str]]


class ApiException(Exception):
    """The API server answered with an HTTP error. `body` is the answer as text (a Status object
    in JSON, whose `message` `vgpu_operator.k8s.describe_error` shows)."""

    def __init__(self, status: int = 0, reason: str = "", body: str = "", what: str = "") -> None:
        self.status, self.reason, self.body, self.what = status, reason, body, what
        super().__init__(status, reason)

    def message(self) -> str:
        """The Status object's message, else the start of the body."""
        with contextlib.suppress(ValueError, AttributeError):
            return str(json.loads(self.body or "{}").get("message") or "")
        return self.body[:200]

    def __str__(self) -> str:
        text = f"HTTP {self.status} {self.reason}".rstrip()
        message = self.message()
        return (f"{self.what}: " if self.what else "") + text + (f": {message}" if message else "")


@dataclass
class Endpoint:
    """Where the API server is and how to log in. The bearer token is re-read from `token_file`
    on every call: projected service-account tokens rotate (about hourly) under a running pod."""

    server: str
    ssl: ssl.SSLContext | bool
    token: str | None = field(default=None, repr=False)
    token_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def headers(self) -> dict[str, str]:
        token = Path(self.token_file).read_text().strip() if self.token_file else self.token
        if token:
            return {"Authorization": f"Bearer {token}"}
        if self.username is not None and self.password is not None:
            basic = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            return {"Authorization": f"Basic {basic}"}
        return {}


def from_connection(found: kubeconfig.Connection, path: str | Path) -> Endpoint:
    """The endpoint of one context that `kubeconfig.read` returned. Exec plugins and auth
    providers are refused (KubeconfigError): nothing here runs them."""
    if found.external_login:
        raise kubeconfig.KubeconfigError(
            f"kubeconfig {path}: context {found.context!r} logs in through an exec plugin or auth provider, "
            f"which is not supported; use a token or a client certificate")
    server = found.server.rstrip("/")
    tls: ssl.SSLContext | bool = tls_context(found) if server.startswith("https") else False
    return Endpoint(server, tls, token=None if found.token_path else found.token, token_file=found.token_path,
                    username=found.username, password=found.password)


def from_kubeconfig(path: str | Path, context: str | None = None) -> Endpoint:
    """The endpoint of a kubeconfig's context (default: its current-context)."""
    return from_connection(kubeconfig.read(Path(path), context), path)


def in_cluster(environ: Mapping[str, str] | None = None, account: Path = SERVICE_ACCOUNT) -> Endpoint:
    """The pod's service account: the API server from the kubelet's environment, its CA and token."""
    environ = os.environ if environ is None else environ
    host, port = environ.get(kubeconfig.IN_CLUSTER_ENV), environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise kubeconfig.KubeconfigError(
            f"not in a cluster ({kubeconfig.IN_CLUSTER_ENV} unset): pass --kubeconfig")
    try:
        context = ssl.create_default_context(cafile=str(account / "ca.crt"))
    except OSError as exc:
        raise kubeconfig.KubeconfigError(f"in-cluster login: {account / 'ca.crt'}: {exc.strerror or exc}; "
                                         f"pass --kubeconfig") from exc
    if not (account / "token").is_file():
        raise kubeconfig.KubeconfigError(f"in-cluster login: {account / 'token'}: no such file; "
                                         f"pass --kubeconfig")
    server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
    return Endpoint(server, context, token_file=str(account / "token"))


def locate_endpoint(path: str | Path | None, context: str | None = None) -> Endpoint:
    """From the kubeconfig at `path`; None: the pod's service account."""
    return from_kubeconfig(path, context) if path else in_cluster()


def exec_login(found: kubeconfig.Connection, path: str | Path) -> kubeconfig.Connection:
    """`found` with the credential its exec plugin prints (EKS, GKE, AKS logins), for a one-shot
    command (vgpuctl): the plugin runs once, as kubectl runs it (KUBERNETES_EXEC_INFO set, its
    stderr and a terminal's stdin passed through). Auth providers stay refused."""
    path = Path(path)
    config = yamlio.load(path.read_text(encoding="utf-8"))
    context = _entry(config, "contexts", found.context)
    spec = _entry(config, "users", str(context.get("user") or "")).get("exec")
    if not isinstance(spec, dict) or not spec.get("command"):
        raise kubeconfig.KubeconfigError(
            f"kubeconfig {path}: context {found.context!r} logs in through an auth provider, which is not "
            f"supported; use an exec plugin, a token or a client certificate")
    command = str(spec["command"])
    if os.sep in command and not os.path.isabs(command):  # kubectl: relative to the kubeconfig
        command = str(path.parent / command)
    env = {**os.environ, **{str(e.get("name")): str(e.get("value")) for e in spec.get("env") or []
                            if isinstance(e, dict)}}
    interactive = sys.stdin.isatty()
    env["KUBERNETES_EXEC_INFO"] = json.dumps({
        "apiVersion": spec.get("apiVersion") or "client.authentication.k8s.io/v1", "kind": "ExecCredential",
        "spec": {"interactive": interactive}})
    where = f"kubeconfig {path}: exec plugin {command}"
    try:
        done = subprocess.run([command, *(str(arg) for arg in spec.get("args") or [])], env=env, timeout=120,
                              stdout=subprocess.PIPE, stdin=None if interactive else subprocess.DEVNULL,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise kubeconfig.KubeconfigError(f"{where}: {exc}") from exc
    if done.returncode:
        raise kubeconfig.KubeconfigError(f"{where}: exit status {done.returncode}")
    try:
        status = json.loads(done.stdout)["status"]
        token, cert, key = (status.get(k) for k in ("token", "clientCertificateData", "clientKeyData"))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise kubeconfig.KubeconfigError(f"{where}: did not print an ExecCredential") from exc
    if not token and not (cert and key):
        raise kubeconfig.KubeconfigError(f"{where}: printed no token and no client certificate")
    return dataclasses.replace(
        found, external_login=False, token=token or None, token_path=None,
        certificate_data=cert.encode() if cert else found.certificate_data,
        certificate_path=None if cert else found.certificate_path,
        key_data=key.encode() if key else found.key_data, key_path=None if key else found.key_path)


def _entry(config: Any, section: str, name: str) -> dict[str, Any]:
    """The named entry's body (`kubeconfig.read` checked that it exists)."""
    for entry in (config or {}).get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return dict(entry.get(section[:-1]) or {})
    return {}


def tls_context(found: kubeconfig.Connection) -> ssl.SSLContext:
    """Server verification (CA from data or file, or none when the kubeconfig says insecure) and
    the client certificate, if any."""
    if found.insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif found.ca_data:
        context = ssl.create_default_context(cadata=found.ca_data.decode())
    elif found.ca_path:
        context = ssl.create_default_context(cafile=found.ca_path)
    else:
        context = ssl.create_default_context()
    if found.certificate_data or found.certificate_path:
        # load_cert_chain wants files: data is written to private ones, loaded, removed.
        with tempfile.TemporaryDirectory() as folder:
            cert = found.certificate_path or _private(Path(folder) / "cert", found.certificate_data)
            key = found.key_path or (_private(Path(folder) / "key", found.key_data) if found.key_data
                                     else None)  # None: the key is in the certificate's file
            context.load_cert_chain(cert, key)
    return context


def _private(path: Path, data: bytes | None) -> str:
    path.write_bytes(data or b"")
    return str(path)


class KubeApi:
    """Calls to one API server. The aiohttp session is opened on the first call (in the caller's
    event loop) and closed by `close` (or `async with`)."""

    def __init__(self, endpoint: Endpoint, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = CONNECT_TIMEOUT, limit: int = 100) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    @property
    def server(self) -> str:
        return self.endpoint.server

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.endpoint.ssl, limit=self._limit),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> KubeApi:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"Accept": JSON, **self.endpoint.headers()}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(self, method: str, path: str, body: Any = None, query: Query | None = None,
                      content_type: str = JSON, timeout: float | None = None) -> dict[str, Any]:
        """The answer's JSON object ({} when it is not one). HTTP >= 400 raises ApiException; no
        complete answer within `timeout` (default: the client's) raises TimeoutError naming the
        call; a refused or dropped connection raises aiohttp's ClientError."""
        deadline = self.timeout if timeout is None else timeout
        what = f"{method} {path}"
        data = None if body is None else json.dumps(body)
        limits = aiohttp.ClientTimeout(total=deadline, sock_connect=min(self.connect_timeout, deadline))
        try:
            async with asyncio.timeout(deadline):  # connect, send, answer and body, all of it
                async with self._open().request(
                        method, self.endpoint.server + path, params=query, data=data,
                        headers=self._headers(content_type if data is not None else None),
                        timeout=limits) as response:
                    raw = await response.read()
                    if response.status >= 400:
                        raise ApiException(response.status, response.reason or "",
                                           raw.decode(errors="replace"), what)
        except TimeoutError as exc:
            if isinstance(exc, aiohttp.ClientConnectionError):  # aiohttp's connect timeout
                connect = min(self.connect_timeout, deadline)
                raise TimeoutError(f"{what}: could not connect within {connect:g}s") from exc
            raise TimeoutError(f"{what}: no answer within {deadline:g}s") from exc
        if not raw:
            return {}
        result = json.loads(raw)
        return result if isinstance(result, dict) else {}

    async def stream(self, path: str, query: Query, timeout_seconds: float,
                     read_timeout: float = WATCH_READ_TIMEOUT, timeout: float | None = None,
                     ) -> AsyncGenerator[dict[str, Any], None]:
        """The JSON lines of a watch until the server ends it. Its headers must come within
        `timeout`, the whole of it within `timeout_seconds` + WATCH_SLACK, and some byte every
        `read_timeout` seconds: otherwise TimeoutError naming the watch. HTTP >= 400 raises
        ApiException."""
        deadline = self.timeout if timeout is None else timeout
        total = timeout_seconds + WATCH_SLACK
        what = f"watch {path}"
        limits = aiohttp.ClientTimeout(total=total, sock_connect=min(self.connect_timeout, deadline),
                                       sock_read=read_timeout)
        request = self._open().get(self.endpoint.server + path, params=query, headers=self._headers(),
                                   timeout=limits)
        try:
            # Before the first yield, so a deadline here cancels only this generator's own work.
            async with asyncio.timeout(deadline):
                response = await request.__aenter__()
        except TimeoutError as exc:
            raise TimeoutError(f"{what}: no answer within {deadline:g}s") from exc
        ended = False  # by the server: the connection can serve another call
        try:
            if response.status >= 400:
                async with asyncio.timeout(deadline):  # no yield yet: safe, as above
                    raw = await response.read()
                raise ApiException(response.status, response.reason or "", raw.decode(errors="replace"), what)
            pending = bytearray()  # JSON lines split at any byte; no cap on a line's length
            while True:
                try:
                    # aiohttp's own timers (total, sock_read) bound each read: an asyncio.timeout
                    # around a yield would cancel the consumer's code instead.
                    chunk = await response.content.readany()
                except aiohttp.ServerTimeoutError as exc:
                    raise TimeoutError(f"{what}: no data for {read_timeout:g}s") from exc
                except TimeoutError as exc:
                    raise TimeoutError(f"{what}: still open after {total:g}s") from exc
                if not chunk:
                    if pending.strip():
                        yield json.loads(bytes(pending))
                    ended = True
                    return
                start = len(pending)
                pending += chunk
                while (end := pending.find(b"\n", start)) != -1:
                    line = bytes(pending[:end])
                    del pending[:end + 1]
                    start = 0
                    if line.strip():
                        yield json.loads(line)
        finally:
            if ended:
                response.release()
            else:  # broken, timed out or abandoned mid-stream: the connection is not reused
                response.close()


async def connect(path: str | Path | None, context: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                  ) -> KubeApi:
    """A client for the kubeconfig at `path` (None: the pod's service account)."""
    return KubeApi(locate_endpoint(path, context), timeout=timeout)
