// Package cluster starts and stops a whole test cluster in a directory:
// the components run as background processes of the kubeplane binary,
// each recorded in a pid file, so that another invocation (kube.sh down)
// can stop them.
//
// A cluster directory holds:
//
//	kubeconfig              admin (system:masters)
//	pki/                    CA, certificates, keys, component kubeconfigs
//	etcd/                   etcd's data
//	run/NAME.pid            one a component: pid and start time
//	logs/NAME.log           one a component
//	pods/NODE/POD/          a Pod's container.log and, while it runs, pgid
package cluster

import (
	"path/filepath"
)

type layout string

func (d layout) kubeconfig() string         { return filepath.Join(string(d), "kubeconfig") }
func (d layout) pki() string                { return filepath.Join(string(d), "pki") }
func (d layout) etcd() string               { return filepath.Join(string(d), "etcd") }
func (d layout) runDir() string             { return filepath.Join(string(d), "run") }
func (d layout) logDir() string             { return filepath.Join(string(d), "logs") }
func (d layout) pods() string               { return filepath.Join(string(d), "pods") }
func (d layout) pidFile(name string) string { return filepath.Join(d.runDir(), name+".pid") }
func (d layout) logFile(name string) string { return filepath.Join(d.logDir(), name+".log") }
