"""Kubeconfig texts for tests that point a command at a local port."""

from __future__ import annotations

# A token login to http://127.0.0.1:<port> (fill the port with `%`).
TOKEN_AT_PORT = """\
apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "http://127.0.0.1:%d"}}]
users: [{name: u, user: {token: t}}]
"""
