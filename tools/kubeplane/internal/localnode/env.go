package localnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/kubernetes/pkg/fieldpath"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// objects reads the Secrets and ConfigMaps a Pod's env refers to.
type objects interface {
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
}

// configError is a Pod the node cannot run as written: it fails with
// Reason and the error's message, as a kubelet reports
// CreateContainerConfigError.
type configError struct {
	Reason string
	Msg    string
}

func (e *configError) Error() string { return e.Msg }

// containerEnv resolves c's env for pod (whose status already holds its
// Pod IP and host IP) the way a kubelet does: in order, each value
// expanded with $(VAR) against the variables before it.
func containerEnv(ctx context.Context, objs objects, pod *corev1.Pod, c *corev1.Container) ([]corev1.EnvVar, error) {
	if len(c.EnvFrom) > 0 {
		return nil, &configError{Reason: "CreateContainerConfigError", Msg: "envFrom is not supported by the stand-in node; list the variables under env"}
	}
	vars := map[string]string{}
	var out []corev1.EnvVar
	for _, e := range c.Env {
		var v string
		switch {
		case e.ValueFrom == nil:
			v = expansion.Expand(e.Value, expansion.MappingFuncFor(vars))
		case e.ValueFrom.FieldRef != nil:
			fv, err := podField(pod, e.ValueFrom.FieldRef.FieldPath)
			if err != nil {
				return nil, &configError{Reason: "CreateContainerConfigError", Msg: fmt.Sprintf("env %s: %v", e.Name, err)}
			}
			v = fv
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s, err := objs.Secret(ctx, pod.Namespace, ref.Name)
			optional := ref.Optional != nil && *ref.Optional
			switch {
			case apierrors.IsNotFound(err) && optional:
				continue
			case apierrors.IsNotFound(err):
				return nil, &configError{Reason: "CreateContainerConfigError", Msg: fmt.Sprintf("env %s: secret %q not found; create it or mark the reference optional", e.Name, ref.Name)}
			case err != nil:
				return nil, fmt.Errorf("env %s: read secret %q: %w", e.Name, ref.Name, err)
			}
			b, ok := s.Data[ref.Key]
			if !ok {
				if optional {
					continue
				}
				return nil, &configError{Reason: "CreateContainerConfigError", Msg: fmt.Sprintf("env %s: secret %q has no key %q; add it or mark the reference optional", e.Name, ref.Name, ref.Key)}
			}
			v = string(b)
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm, err := objs.ConfigMap(ctx, pod.Namespace, ref.Name)
			optional := ref.Optional != nil && *ref.Optional
			switch {
			case apierrors.IsNotFound(err) && optional:
				continue
			case apierrors.IsNotFound(err):
				return nil, &configError{Reason: "CreateContainerConfigError", Msg: fmt.Sprintf("env %s: configmap %q not found; create it or mark the reference optional", e.Name, ref.Name)}
			case err != nil:
				return nil, fmt.Errorf("env %s: read configmap %q: %w", e.Name, ref.Name, err)
			}
			cv, ok := cm.Data[ref.Key]
			if !ok {
				if bv, bok := cm.BinaryData[ref.Key]; bok {
					cv, ok = string(bv), true
				}
			}
			if !ok {
				if optional {
					continue
				}
				return nil, &configError{Reason: "CreateContainerConfigError", Msg: fmt.Sprintf("env %s: configmap %q has no key %q; add it or mark the reference optional", e.Name, ref.Name, ref.Key)}
			}
			v = cv
		default:
			return nil, &configError{Reason: "CreateContainerConfigError", Msg: fmt.Sprintf("env %s: only value, fieldRef, secretKeyRef and configMapKeyRef are supported by the stand-in node", e.Name)}
		}
		vars[e.Name] = v
		out = append(out, corev1.EnvVar{Name: e.Name, Value: v})
	}
	return out, nil
}

// podField is the downward API value of path for pod.
func podField(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.podIPs":
		return pod.Status.PodIP, nil
	case "status.hostIP", "status.hostIPs":
		return pod.Status.HostIP, nil
	}
	v, err := fieldpath.ExtractFieldPathAsString(pod, path)
	if err != nil {
		return "", fmt.Errorf("fieldRef %q is not supported by the stand-in node: %w", path, err)
	}
	return v, nil
}

// commandLine expands $(VAR) in c's command and args against env, as a
// kubelet does, and resolves command[0] through pathList.
func commandLine(c *corev1.Container, env []corev1.EnvVar, pathList string) (string, []string, error) {
	if len(c.Command) == 0 {
		return "", nil, &configError{Reason: "CreateContainerConfigError", Msg: "container has no command: the stand-in node pulls no image, so there is no entrypoint; set command"}
	}
	vars := map[string]string{}
	for _, e := range env {
		vars[e.Name] = e.Value
	}
	mapping := expansion.MappingFuncFor(vars)
	var argv []string
	for _, s := range append(append([]string{}, c.Command...), c.Args...) {
		argv = append(argv, expansion.Expand(s, mapping))
	}
	path, err := lookPath(argv[0], pathList)
	if err != nil {
		return "", nil, &configError{Reason: "CreateContainerError", Msg: err.Error()}
	}
	return path, argv[1:], nil
}

// lookPath finds name in the colon-separated directories of pathList (a
// name with a slash is used as it is).
func lookPath(name, pathList string) (string, error) {
	if strings.Contains(name, "/") {
		if isExecutable(name) {
			return name, nil
		}
		return "", fmt.Errorf("%s is not an executable file on the node", name)
	}
	for _, dir := range filepath.SplitList(pathList) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q not found in the node's PATH (%s); put its directory in KUBE_NODE_PATH", name, pathList)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// checkVolumes refuses what a process on the host cannot see as the Pod
// asks: only a hostPath mounted at its own path works. Projected
// service-account token volumes and their mounts are ignored.
func checkVolumes(pod *corev1.Pod, c *corev1.Container) error {
	vols := map[string]*corev1.Volume{}
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		vols[v.Name] = v
		if v.PersistentVolumeClaim != nil {
			return &configError{Reason: "UnsupportedVolume", Msg: fmt.Sprintf("volume %q: persistentVolumeClaim is unsupported by the stand-in node; use a hostPath mounted at its own path", v.Name)}
		}
	}
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		switch {
		case !ok:
			return &configError{Reason: "CreateContainerConfigError", Msg: fmt.Sprintf("volume mount %q names no volume of the Pod", m.Name)}
		case isServiceAccountToken(v):
			continue
		case v.HostPath != nil && filepath.Clean(v.HostPath.Path) == filepath.Clean(m.MountPath) && m.SubPath == "":
			continue
		case v.HostPath != nil:
			return &configError{Reason: "UnsupportedVolume", Msg: fmt.Sprintf("volume %q: hostPath %s mounted at %s is unsupported by the stand-in node (processes see the host file system; mount it at %s)", m.Name, v.HostPath.Path, m.MountPath, v.HostPath.Path)}
		default:
			return &configError{Reason: "UnsupportedVolume", Msg: fmt.Sprintf("volume %q: this volume type is unsupported by the stand-in node; only a hostPath mounted at its own path works", m.Name)}
		}
	}
	return nil
}

func isServiceAccountToken(v *corev1.Volume) bool {
	if v.Projected == nil {
		return false
	}
	for _, s := range v.Projected.Sources {
		if s.ServiceAccountToken != nil {
			return true
		}
	}
	return false
}
