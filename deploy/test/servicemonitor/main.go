// Command servicemonitor checks the ServiceMonitor objects that `helm template` renders for
// rota's chart against the Prometheus Operator's own Go types: every YAML document on stdin
// whose kind is ServiceMonitor must decode into monitoringv1.ServiceMonitor with no unknown
// field, scrape /metrics on the Service port named "admin", and send a bearer token from a
// Secret. Documents of other kinds are skipped; kubernetes-validate checks those against the
// Kubernetes API schemas.
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"
)

func main() {
	data, err := io.ReadAll(bufio.NewReader(os.Stdin))
	if err != nil {
		fmt.Fprintln(os.Stderr, "servicemonitor:", err)
		os.Exit(1)
	}
	checked := 0
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		var head struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			fail("a document is not YAML: %v", err)
		}
		if head.Kind != "ServiceMonitor" {
			continue
		}
		var monitor monitoringv1.ServiceMonitor
		if err := yaml.UnmarshalStrict(doc, &monitor); err != nil {
			fail("ServiceMonitor does not match monitoring.coreos.com/v1: %v", err)
		}
		check(&monitor)
		checked++
	}
	fmt.Printf("%d ServiceMonitor checked\n", checked)
}

func check(monitor *monitoringv1.ServiceMonitor) {
	if monitor.APIVersion != "monitoring.coreos.com/v1" {
		fail("ServiceMonitor %s: apiVersion %q", monitor.Name, monitor.APIVersion)
	}
	if len(monitor.Spec.Selector.MatchLabels) == 0 {
		fail("ServiceMonitor %s selects no Service", monitor.Name)
	}
	if len(monitor.Spec.Endpoints) == 0 {
		fail("ServiceMonitor %s has no endpoint", monitor.Name)
	}
	for _, endpoint := range monitor.Spec.Endpoints {
		if endpoint.Port != "admin" || endpoint.Path != "/metrics" {
			fail("ServiceMonitor %s scrapes port %q path %q, not admin /metrics", monitor.Name, endpoint.Port, endpoint.Path)
		}
		auth := endpoint.Authorization
		if auth == nil || auth.Credentials == nil || auth.Credentials.Name == "" || auth.Credentials.Key == "" {
			fail("ServiceMonitor %s sends no token from a Secret", monitor.Name)
		}
		if !strings.EqualFold(auth.Type, "Bearer") {
			fail("ServiceMonitor %s: authorization type %q, not Bearer", monitor.Name, auth.Type)
		}
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "servicemonitor: "+format+"\n", args...)
	os.Exit(1)
}
