// Package e2e holds kubeplane's end-to-end tests: they drive the built
// binary through scripts/kube.sh, so that their test binary links
// client-go only, not the control plane kubeplane compiles in.
package e2e
