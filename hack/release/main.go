// Command release builds the release manifests from deploy/base (one source of truth) and
// processes them with clusterctl's and Helm's own libraries for the tests:
//
//	release manifests --out target/release-manifests   clusterctl local repository: addon-components.yaml + metadata.yaml
//	release chart --out deploy/helm/capc-health-shim    the Helm chart (committed; tests keep it in sync)
//	release clusterctl --repo DIR [--target-namespace NS] [--version vX.Y.Z]
//	                                                    what clusterctl makes of the components (stdout)
//	release helm-template --chart DIR --namespace NS [--set k=v]... [--values FILE]...
//	                                                    what `helm template` renders (stdout)
//	release image --binary FILE --out DIR [--image REF] the OCI image archive, its digest and SBOM (image.go)
//	release test-image --out DIR --binary FILE --sim FILE --kubeconfig FILE [--crane FILE]
//	                                                    runs the image from its own filesystem (imagetest.go)
//
// --root is the repository (default: two directories up from the working directory, i.e. the
// repository when run from hack/release).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func defaultRoot() string {
	wd, _ := os.Getwd()
	return filepath.Clean(filepath.Join(wd, "..", ".."))
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: release manifests|chart|clusterctl|helm-template|kustomize|image|test-image|dist [flags]")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	root := fs.String("root", defaultRoot(), "the repository")
	out := fs.String("out", "", "output directory")
	repo := fs.String("repo", "", "clusterctl local repository (manifests --out)")
	version := fs.String("version", "", "provider version (default: the workspace's)")
	targetNS := fs.String("target-namespace", "", "clusterctl --target-namespace")
	chartDir := fs.String("chart", "", "chart directory")
	namespace := fs.String("namespace", "capc-health-shim-system", "release namespace")
	release := fs.String("release-name", "capc-health-shim", "release name")
	binary := fs.String("binary", "", "the release binary (image)")
	imageRef := fs.String("image", "", "the image reference (default: the base's)")
	sim := fs.String("sim", "", "the cloudstack-sim binary (test-image)")
	kubeconfig := fs.String("kubeconfig", "", "a kubeconfig of a test API server (test-image)")
	crane := fs.String("crane", "crane", "the crane command (test-image pushes the image with it)")
	digestFile := fs.String("digest-file", "", "pin --image to the digest in this file (manifests, chart)")
	dir := fs.String("dir", "", "a kustomization directory (kustomize)")
	imageDir := fs.String("image-dir", "", "what make image wrote (dist)")
	var sets, valueFiles, components multi
	fs.Var(&components, "component", "a kustomize Component to build --dir with (kustomize; repeatable)")
	fs.Var(&sets, "set", "a value, as helm --set (repeatable)")
	fs.Var(&valueFiles, "values", "a values file (repeatable)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "manifests":
		if *out == "" {
			return fmt.Errorf("manifests: --out is required")
		}
		b, err := loadPinnedBase(*root, *imageRef, *digestFile)
		if err != nil {
			return err
		}
		p, err := writeRepository(b, *out)
		if err != nil {
			return err
		}
		fmt.Println(p)
		fmt.Println(filepath.Join(filepath.Dir(p), "metadata.yaml"))
	case "chart":
		if *out == "" {
			return fmt.Errorf("chart: --out is required")
		}
		b, err := loadPinnedBase(*root, *imageRef, *digestFile)
		if err != nil {
			return err
		}
		if err := writeChart(b, *out); err != nil {
			return err
		}
		fmt.Println(*out)
	case "clusterctl":
		if *repo == "" {
			return fmt.Errorf("clusterctl: --repo is required")
		}
		v := *version
		if v == "" {
			wv, err := workspaceVersion(*root)
			if err != nil {
				return err
			}
			v = "v" + wv
		}
		abs, err := filepath.Abs(*repo)
		if err != nil {
			return err
		}
		url := "file://" + filepath.ToSlash(filepath.Join(abs, providerLabel, v, "addon-components.yaml"))
		comps, err := clusterctlGenerate(context.Background(), url, v, *targetNS)
		if err != nil {
			return err
		}
		y, err := comps.Yaml()
		if err != nil {
			return err
		}
		os.Stdout.Write(y)
	case "helm-template":
		if *chartDir == "" {
			*chartDir = filepath.Join(*root, "deploy", "helm", chartName)
		}
		text, err := helmTemplate(*chartDir, *release, *namespace, valueFiles, sets)
		if err != nil {
			return err
		}
		fmt.Print(text)
	case "kustomize":
		if *dir == "" {
			return fmt.Errorf("kustomize: --dir is required")
		}
		text, err := kustomizeBuild(*dir, components)
		if err != nil {
			return err
		}
		os.Stdout.Write(text)
	case "dist":
		if *out == "" || *imageDir == "" {
			return fmt.Errorf("dist: --out and --image-dir are required")
		}
		b, err := loadBase(*root)
		if err != nil {
			return err
		}
		files, err := makeDist(b, *imageDir, *imageRef, *out)
		if err != nil {
			return err
		}
		for _, f := range files {
			st, err := os.Stat(filepath.Join(*out, f))
			if err != nil {
				return err
			}
			fmt.Printf("%10d  %s\n", st.Size(), filepath.Join(*out, f))
		}
	case "image":
		if *binary == "" || *out == "" {
			return fmt.Errorf("image: --binary and --out are required")
		}
		return makeImage(*root, *binary, *imageRef, *out)
	case "test-image":
		if *out == "" || *binary == "" || *sim == "" || *kubeconfig == "" {
			return fmt.Errorf("test-image: --out, --binary, --sim and --kubeconfig are required")
		}
		return testImage(*root, *out, *binary, *sim, *kubeconfig, *crane)
	default:
		return fmt.Errorf("unknown command %q", args[0])
	}
	return nil
}

// loadPinnedBase is the base, its image pinned to ref@digest when both are given (pin.go).
func loadPinnedBase(root, ref, digestFile string) (*base, error) {
	b, err := loadBase(root)
	if err != nil || (ref == "" && digestFile == "") {
		return b, err
	}
	if ref == "" || digestFile == "" {
		return nil, fmt.Errorf("--image and --digest-file go together")
	}
	digest, err := readDigest(digestFile)
	if err != nil {
		return nil, err
	}
	return b, pinImage(b, ref, digest)
}
