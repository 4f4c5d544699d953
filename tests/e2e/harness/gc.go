package harness

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The test API server runs no kube-controller-manager, so nothing garbage-collects objects whose
// owners are gone (CAPI and CAPC rely on that for e.g. CloudStackMachineStateCheckers and
// Secrets owned by the Cluster). The harness does what the garbage collector's background
// deletion would: an object all of whose owners (of the kinds below) no longer exist is deleted.
// Objects the harness created itself have no owners and are never touched.

// ManagedKinds are the CAPI/CAPC kinds (and Secrets) a cluster's lifecycle creates.
var ManagedKinds = []schema.GroupVersionKind{
	{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "Cluster"},
	{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "MachineDeployment"},
	{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "MachineSet"},
	{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "Machine"},
	{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta1", Kind: "KubeadmControlPlane"},
	{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta1", Kind: "KubeadmConfig"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackCluster"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackMachine"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackFailureDomain"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackAffinityGroup"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackIsolatedNetwork"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackMachineStateChecker"},
	{Group: "", Version: "v1", Kind: "Secret"},
}

// ownerOnlyKinds are listed only to know their UIDs (user-created templates and MHCs own
// objects but are never collected): with ManagedKinds, the kinds whose absence the collector
// can judge.
var ownerOnlyKinds = []schema.GroupVersionKind{
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackMachineTemplate"},
	{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta1", Kind: "KubeadmConfigTemplate"},
	{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "MachineHealthCheck"},
}

func listKind(ctx context.Context, c client.Client, namespace string, gvk schema.GroupVersionKind) ([]unstructured.Unstructured, error) {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	if err := c.List(ctx, l, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	return l.Items, nil
}

// CollectGarbage deletes the namespace's objects whose owners are all gone; returns how many.
func CollectGarbage(ctx context.Context, c client.Client, namespace string) (int, error) {
	uids := map[types.UID]bool{}
	judged := map[string]bool{}
	var candidates []unstructured.Unstructured
	for _, gvk := range append(append([]schema.GroupVersionKind{}, ManagedKinds...), ownerOnlyKinds...) {
		items, err := listKind(ctx, c, namespace, gvk)
		if err != nil {
			return 0, err
		}
		judged[gvk.Kind] = true
		for _, o := range items {
			uids[o.GetUID()] = true
			if len(o.GetOwnerReferences()) > 0 {
				candidates = append(candidates, o)
			}
		}
	}
	deleted := 0
	for i := range candidates {
		o := &candidates[i]
		orphan := true
		for _, ref := range o.GetOwnerReferences() {
			if !judged[ref.Kind] || uids[ref.UID] {
				orphan = false
				break
			}
		}
		// The lists above are not one snapshot: an owner created after its kind was listed
		// (a Machine with its KubeadmConfig and CloudStackMachine) is missing from uids. As the
		// real garbage collector does, ask the API server for each owner before deleting.
		if orphan {
			gone, err := ownersGone(ctx, c, o)
			if err != nil {
				return deleted, err
			}
			orphan = gone
		}
		if orphan && o.GetDeletionTimestamp() == nil {
			if err := c.Delete(ctx, o, client.PropagationPolicy("Background")); client.IgnoreNotFound(err) != nil {
				return deleted, err
			}
			deleted++
		}
	}
	return deleted, nil
}

// ownersGone reports whether every owner of o is absent from the API server now (not found, or
// found with another UID: a new object of the same name).
func ownersGone(ctx context.Context, c client.Client, o *unstructured.Unstructured) (bool, error) {
	for _, ref := range o.GetOwnerReferences() {
		owner := &unstructured.Unstructured{}
		owner.SetAPIVersion(ref.APIVersion)
		owner.SetKind(ref.Kind)
		err := c.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: ref.Name}, owner)
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return false, err
		case owner.GetUID() == ref.UID:
			return false, nil
		}
	}
	return true, nil
}

// RunGarbageCollector collects every interval in the namespaces namespaces() returns.
func RunGarbageCollector(ctx context.Context, c client.Client, namespaces func() []string, interval time.Duration) {
	Every(ctx, interval, func() {
		for _, ns := range namespaces() {
			_, _ = CollectGarbage(ctx, c, ns)
		}
	})
}

// Leftovers lists "Kind/name" of the managed objects still in the namespace, skipping the
// Secrets the user (the harness) created.
func Leftovers(ctx context.Context, c client.Client, namespace string, userSecrets map[string]bool) ([]string, error) {
	var out []string
	for _, gvk := range ManagedKinds {
		items, err := listKind(ctx, c, namespace, gvk)
		if err != nil {
			return nil, err
		}
		for _, o := range items {
			if gvk.Kind == "Secret" && (userSecrets[o.GetName()] || len(o.GetOwnerReferences()) == 0 && !clusterSecret(o)) {
				continue
			}
			out = append(out, gvk.Kind+"/"+o.GetName())
		}
	}
	return out, nil
}

// clusterSecret: Secrets CAPI labels with the cluster name (CAs, kubeconfig, bootstrap data).
func clusterSecret(o unstructured.Unstructured) bool {
	_, ok := o.GetLabels()["cluster.x-k8s.io/cluster-name"]
	return ok
}
