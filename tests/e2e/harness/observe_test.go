package harness

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"
	controlplanev1 "sigs.k8s.io/cluster-api/controlplane/kubeadm/api/v1beta1"
)

// A recorder whose reads fail counts every failed step and keeps the error (Recorder.Run
// dropped them before issue 42): a real client against a port nothing listens on.
func TestRecorderCountsFailedSteps(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now: every request is refused

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clusterv1.AddToScheme, controlplanev1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	mapper := meta.NewDefaultRESTMapper(nil)
	for _, gvk := range []schema.GroupVersionKind{
		clusterv1.GroupVersion.WithKind("Machine"),
		controlplanev1.GroupVersion.WithKind("KubeadmControlPlane"),
	} {
		mapper.Add(gvk, meta.RESTScopeNamespace)
	}
	c, err := client.New(&rest.Config{Host: "http://" + addr, Timeout: time.Second}, client.Options{Scheme: scheme, Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}
	r := NewRecorder(c, "ns", ShimConditionType, "v1beta2", &Timeline{Start: time.Now()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	err = WaitFor(context.Background(), 10*time.Second, 50*time.Millisecond, "two failed steps", func() (bool, error) {
		_, failed, _ := r.Health()
		return failed >= 2, nil
	})
	cancel()
	<-done
	if err != nil {
		t.Fatal(err)
	}
	steps, failed, errs := r.Health()
	if failed != steps || len(errs) == 0 || !strings.Contains(errs[0], "list Machines") {
		t.Errorf("steps %d, failed %d, errors %q: want every step failed, naming the Machine list", steps, failed, errs)
	}
	if len(errs) > maxRecorderErrors {
		t.Errorf("%d errors kept, want at most %d", len(errs), maxRecorderErrors)
	}
}
