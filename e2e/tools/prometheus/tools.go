//go:build tools

// Package tools records the command built from this module (e2e/controlplane.py builds it):
// promtool checks the chart's rules, runs their unit tests and lints live metric scrapes.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
