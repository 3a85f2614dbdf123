// Package kube runs a hive's workers as Kubernetes Pods (`apiary queen
// --kubernetes`, docs/kubernetes.md): one Pod per worker, restartPolicy
// Never (Kubernetes never restarts a worker behind apiary's back: the
// queen's desired state replaces it), labelled with its worker and
// lifecycle ids, owned by one ConfigMap of the installation so that
// deleting it garbage-collects every worker Pod. The cluster's nodes are
// the pool's devices (each node's CPU and memory, and its GPUs); a Pod's
// phase is its worker's process: Failed, evicted or deleted ends it.
package kube

import (
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/version"
)

// InCluster as Config.Kubeconfig reads the Pod's service account.
const InCluster = "in-cluster"

// Defaults.
const (
	DefaultNamespace    = "apiary"
	DefaultInstallation = "apiary"
	// WorkerPort is the port every worker Pod listens on, on its own Pod
	// IP.
	WorkerPort = 8080
)

// DefaultImage is the image of this version of apiary.
func DefaultImage() string {
	v := version.Version
	if v == "" || strings.ContainsAny(v, " +") {
		v = "latest"
	}
	return "apiary:" + v
}

// Config says which cluster runs the workers and how their Pods look.
type Config struct {
	// Kubeconfig is a kubeconfig file, or InCluster; required.
	Kubeconfig string
	// Namespace the Pods, their Secrets and the owner ConfigMap live in;
	// default DefaultNamespace. It must exist.
	Namespace string
	// Image of the worker Pods; default DefaultImage.
	Image string
	// Command runs apiary in the image; default ["apiary"].
	Command []string
	// ModelsPVC or ModelsHostPath is the models volume, mounted read-only
	// at ModelsDir in every worker Pod; exactly one is set.
	ModelsPVC      string
	ModelsHostPath string
	// ModelsDir is where the worker finds the models: the hive's models
	// directory, the same path in the Pod.
	ModelsDir string
	// Installation names the owner ConfigMap (apiary-INSTALLATION) and
	// labels every object; default DefaultInstallation.
	Installation string
	Logger       *slog.Logger // default slog.Default()
}

func (c Config) withDefaults() Config {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Image == "" {
		c.Image = DefaultImage()
	}
	if len(c.Command) == 0 {
		c.Command = []string{"apiary"}
	}
	if c.Installation == "" {
		c.Installation = DefaultInstallation
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every problem of c by field name.
func (c Config) Validate() error {
	var p config.Problems
	if c.Kubeconfig == "" {
		p.Add("Kubeconfig", "a kubeconfig file or %s is required", InCluster)
	}
	if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		p.Add("Namespace", "%q: %s", c.Namespace, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsDNS1123Label(ownerName(c.Installation)); len(msgs) > 0 || len(validation.IsValidLabelValue(c.Installation)) > 0 {
		p.Add("Installation", "%q: lower-case letters, digits and '-', at most 50 characters", c.Installation)
	}
	switch {
	case c.ModelsPVC == "" && c.ModelsHostPath == "":
		p.Add("ModelsPVC", "the models volume of the worker Pods is required: a claim, or a host path (ModelsHostPath)")
	case c.ModelsPVC != "" && c.ModelsHostPath != "":
		p.Add("ModelsPVC", "give one models volume, a claim or a host path (ModelsHostPath), not both")
	case c.ModelsPVC != "" && len(validation.IsDNS1123Subdomain(c.ModelsPVC)) > 0:
		p.Add("ModelsPVC", "%q is not a claim name", c.ModelsPVC)
	case c.ModelsHostPath != "" && !filepath.IsAbs(c.ModelsHostPath):
		p.Add("ModelsHostPath", "%q: an absolute path", c.ModelsHostPath)
	}
	if c.ModelsDir == "" || !filepath.IsAbs(c.ModelsDir) {
		p.Add("ModelsDir", "%q: the absolute path the models are mounted at", c.ModelsDir)
	}
	if c.Image == "" {
		p.Add("Image", "empty")
	}
	return p.Err()
}

// ownerName is the owner ConfigMap's name.
func ownerName(installation string) string { return "apiary-" + installation }

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
