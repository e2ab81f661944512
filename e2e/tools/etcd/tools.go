//go:build tools

// Package tools records the command built from this module (e2e/controlplane.py builds it).
package tools

import _ "go.etcd.io/etcd/server/v3"
