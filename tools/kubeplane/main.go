// Command kubeplane is a Kubernetes v1.37.2 control plane for tests in one
// binary. Each component is a subcommand; up and down start and stop a
// whole cluster in a directory. scripts/kube.sh builds and drives it.
//
//	kubeplane up DIR [NODES]        start a cluster, wait until it is ready
//	kubeplane down DIR              stop it
//	kubeplane kubectl ARGS…         kubectl
//	kubeplane apiserver|scheduler|controller-manager FLAGS…
//	                                the real component with its own flags
//	kubeplane etcd FLAGS…           an embedded etcd
//	kubeplane node NAME FLAGS…      a stand-in node
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/apiary-llm/apiary/tools/kubeplane/internal/cluster"
	"github.com/apiary-llm/apiary/tools/kubeplane/internal/controlplane"
	"github.com/apiary-llm/apiary/tools/kubeplane/internal/localnode"
)

func main() {
	// The Kubernetes commands set up their own signal handling and logs.
	if len(os.Args) > 1 {
		switch args := os.Args[2:]; os.Args[1] {
		case "apiserver":
			os.Exit(controlplane.APIServer(args))
		case "scheduler":
			os.Exit(controlplane.Scheduler(args))
		case "controller-manager":
			os.Exit(controlplane.ControllerManager(args))
		case "kubectl":
			os.Exit(controlplane.Kubectl(args))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "kubeplane:", err)
		os.Exit(1)
	}
}

const usage = `usage: kubeplane up DIR [NODES] | down DIR | kubectl ARGS… |
       apiserver|scheduler|controller-manager FLAGS… | etcd FLAGS… | node NAME FLAGS…`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	switch args[0] {
	case "up":
		return up(ctx, log, args[1:])
	case "down":
		if len(args) != 2 {
			return errors.New("usage: kubeplane down DIR")
		}
		return cluster.Down(log, args[1])
	case "etcd":
		fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
		var c controlplane.EtcdConfig
		fs.StringVar(&c.DataDir, "data-dir", "", "etcd's data directory")
		fs.IntVar(&c.ClientPort, "client-port", 0, "client port on 127.0.0.1")
		fs.IntVar(&c.PeerPort, "peer-port", 0, "peer port on 127.0.0.1")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return controlplane.RunEtcd(ctx, log.With("component", "etcd"), c)
	case "node":
		if len(args) < 2 {
			return errors.New("usage: kubeplane node NAME FLAGS…")
		}
		c := localnode.Config{Name: args[1]}
		fs := flag.NewFlagSet("node", flag.ContinueOnError)
		fs.IntVar(&c.Index, "index", 0, "node number from 1 (Pod IPs PREFIX.(index+10).N)")
		fs.StringVar(&c.PodIPPrefix, "pod-ip-prefix", "127.0", "the cluster's Pod IP range, 127.X")
		fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "kubeconfig of the node")
		fs.StringVar(&c.PodsDir, "pods-dir", "", "directory for the Pods' output")
		fs.IntVar(&c.Port, "port", 0, "kubelet API port on 127.0.0.1")
		fs.StringVar(&c.CertFile, "cert", "", "kubelet API serving certificate")
		fs.StringVar(&c.KeyFile, "key", "", "kubelet API serving key")
		fs.IntVar(&c.GPUs, "gpus", 0, "nvidia.com/gpu capacity")
		fs.StringVar(&c.Path, "path", "", "directories searched before PATH for Pod commands")
		if err := fs.Parse(args[2:]); err != nil {
			return err
		}
		// fd 3, when up passed it, holds the cluster's claim on its Pod IP
		// range: the node keeps it, its Pods must not.
		syscall.CloseOnExec(3)
		return localnode.Run(ctx, log.With("node", c.Name), c)
	}
	return fmt.Errorf("unknown subcommand %q\n%s", args[0], usage)
}

func up(ctx context.Context, log *slog.Logger, args []string) error {
	if len(args) < 1 || len(args) > 2 {
		return errors.New("usage: kubeplane up DIR [NODES]")
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the kubeplane binary: %w", err)
	}
	c := cluster.Config{Dir: args[0], Binary: self, NodePath: os.Getenv("KUBE_NODE_PATH")}
	if len(args) == 2 {
		if c.Nodes, err = strconv.Atoi(args[1]); err != nil {
			return fmt.Errorf("NODES must be a number, not %q", args[1])
		}
	}
	if g := os.Getenv("KUBE_NODE_GPUS"); g != "" {
		if c.NodeGPUs, err = strconv.Atoi(g); err != nil {
			return fmt.Errorf("KUBE_NODE_GPUS must be a number, not %q", g)
		}
	}
	return cluster.Up(ctx, log, c)
}
