//go:build tools

// Package tools records the commands built from this module (e2e/controlplane.py builds them).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
