//go:build tools

// Package tools records the command built from this module (e2e/controlplane.py builds it).
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
