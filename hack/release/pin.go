package main

// Release files that name the image by digest: `make release-manifests IMAGE=…` after `make
// image` writes REF@sha256:… (the digest of the image just built) as the clusterctl components'
// default image and into the chart's default values, so that what a user installs is exactly
// the image that was tested.

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
)

var digestRE = regexp.MustCompile(`^sha256:[a-f0-9]{64}$`)

// readDigest reads a digest file as make image writes it.
func readDigest(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("the image's digest (run make image first): %w", err)
	}
	d := strings.TrimSpace(string(b))
	if !digestRE.MatchString(d) {
		return "", fmt.Errorf("%s: %q is not a sha256 digest", file, d)
	}
	return d, nil
}

// pinImage makes the base's manager container name ref@digest; ref is repository:tag.
func pinImage(b *base, ref, digest string) error {
	if _, _, err := splitImage(ref); err != nil {
		return fmt.Errorf("IMAGE: %w", err)
	}
	if !digestRE.MatchString(digest) {
		return fmt.Errorf("digest %q is not sha256:<64 hex digits>", digest)
	}
	_, c, err := managerOf(b.objs)
	if err != nil {
		return err
	}
	n, err := c.Pipe(kyaml.Lookup("image"))
	if err != nil || n == nil {
		return fmt.Errorf("the %s container has no image", managerContainer)
	}
	n.YNode().Value = ref + "@" + digest
	return nil
}

// splitPinned splits repository:tag[@digest].
func splitPinned(image string) (repo, tag, digest string, err error) {
	if at := strings.Index(image, "@"); at >= 0 {
		image, digest = image[:at], image[at+1:]
		if !digestRE.MatchString(digest) {
			return "", "", "", fmt.Errorf("image digest %q is not sha256:<64 hex digits>", digest)
		}
	}
	repo, tag, err = splitImage(image)
	return repo, tag, digest, err
}
