//go:build tools

// Package monitoring pins the Prometheus module whose promtool checks and unit-tests
// deploy/components/monitoring's rules (make test-monitoring builds it into target/tools/promtool).
package monitoring

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
