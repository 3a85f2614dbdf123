package main

import (
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/apiary-llm/apiary/internal/kube"
)

// kubeFlags are the Kubernetes flags of `apiary queen` and `apiary hive`
// (docs/kubernetes.md); the queen hands them to its local hive.
type kubeFlags struct {
	kubeconfig, namespace, image string
	modelsPVC, modelsHostPath    string
}

var kubeFlagNames = []string{"kubernetes", "kube-namespace", "kube-image", "kube-models-pvc", "kube-models-hostpath"}

func (f *kubeFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&f.kubeconfig, "kubernetes", "", `run workers as Pods of this Kubernetes cluster: a kubeconfig file, or "in-cluster"`)
	fl.StringVar(&f.namespace, "kube-namespace", kube.DefaultNamespace, "namespace of the worker Pods (it must exist)")
	fl.StringVar(&f.image, "kube-image", kube.DefaultImage(), "image of the worker Pods (runs `apiary worker`)")
	fl.StringVar(&f.modelsPVC, "kube-models-pvc", "", "PersistentVolumeClaim of the models, mounted read-only in every worker Pod at the models directory")
	fl.StringVar(&f.modelsHostPath, "kube-models-hostpath", "", "host directory of the models on every node, mounted read-only in every worker Pod at the same path")
}

// config is the hive's Kubernetes config; nil without --kubernetes.
func (f *kubeFlags) config() (*kube.Config, error) {
	if f.kubeconfig == "" {
		for _, v := range []string{f.modelsPVC, f.modelsHostPath} {
			if v != "" {
				return nil, usagef("--kube-models-pvc and --kube-models-hostpath need --kubernetes")
			}
		}
		return nil, nil
	}
	c := &kube.Config{Kubeconfig: f.kubeconfig, Namespace: f.namespace, Image: f.image, ModelsPVC: f.modelsPVC}
	if f.kubeconfig != kube.InCluster {
		abs, err := filepath.Abs(f.kubeconfig)
		if err != nil {
			return nil, usagef("--kubernetes %q: %v", f.kubeconfig, err)
		}
		c.Kubeconfig = abs
	}
	if f.modelsHostPath != "" {
		abs, err := filepath.Abs(f.modelsHostPath)
		if err != nil {
			return nil, usagef("--kube-models-hostpath %q: %v", f.modelsHostPath, err)
		}
		c.ModelsHostPath = abs
	}
	if c.ModelsPVC == "" && c.ModelsHostPath == "" {
		return nil, usagef("--kubernetes needs the models volume of the worker Pods: --kube-models-pvc NAME or --kube-models-hostpath DIR")
	}
	return c, nil
}

// kubeHiveArgs are c as the flags of the queen's local hive.
func kubeHiveArgs(c *kube.Config) []string {
	a := []string{"--kubernetes=" + c.Kubeconfig, "--kube-namespace=" + c.Namespace, "--kube-image=" + c.Image}
	if c.ModelsPVC != "" {
		a = append(a, "--kube-models-pvc="+c.ModelsPVC)
	}
	if c.ModelsHostPath != "" {
		a = append(a, "--kube-models-hostpath="+c.ModelsHostPath)
	}
	return a
}
