// Package controlplane runs the real Kubernetes v1.37.2 control-plane
// components inside kubeplane: an embedded etcd, and kube-apiserver,
// kube-scheduler, kube-controller-manager and kubectl through their own
// cobra commands, given the flags on kubeplane's command line unchanged.
package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// APIServer runs kube-apiserver with args and returns its exit code.
func APIServer(args []string) int { return runCobra(apiserver.NewAPIServerCommand(), args) }

// Scheduler runs kube-scheduler with args and returns its exit code.
func Scheduler(args []string) int {
	return runCobra(scheduler.NewSchedulerCommand(), args)
}

// ControllerManager runs kube-controller-manager with args and returns its exit code.
func ControllerManager(args []string) int {
	return runCobra(controllermanager.NewControllerManagerCommand(), args)
}

// Kubectl runs kubectl with args; like kubectl's own main, it exits the
// process on error with kubectl's message and code.
func Kubectl(args []string) int {
	cmd := kubectl.NewDefaultKubectlCommandWithArgs(kubectl.KubectlOptions{
		Arguments:   append([]string{"kubectl"}, args...),
		ConfigFlags: genericclioptions.NewConfigFlags(true).WithDeprecatedPasswordFlag().WithDiscoveryBurst(300).WithDiscoveryQPS(50.0),
		IOStreams:   genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr},
	})
	cmd.SetArgs(args)
	if err := cli.RunNoErrOutput(cmd); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}

func runCobra(cmd *cobra.Command, args []string) int {
	cmd.SetArgs(args)
	return cli.Run(cmd)
}

// EtcdConfig is one single-member etcd.
type EtcdConfig struct {
	// DataDir holds etcd's data; created when absent.
	DataDir string
	// ClientPort and PeerPort are ports on 127.0.0.1; both required.
	ClientPort, PeerPort int
}

// RunEtcd serves an embedded etcd until ctx ends, then closes it. Fsync is
// off: the data of a test cluster is not worth the disk's time.
func RunEtcd(ctx context.Context, log *slog.Logger, c EtcdConfig) error {
	if c.DataDir == "" || c.ClientPort == 0 || c.PeerPort == 0 {
		return fmt.Errorf("etcd needs --data-dir, --client-port and --peer-port")
	}
	cfg := embed.NewConfig()
	cfg.Name = "kubeplane"
	cfg.Dir = c.DataDir
	client := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", c.ClientPort)}
	peer := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", c.PeerPort)}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	cfg.UnsafeNoFsync = true
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return fmt.Errorf("create the etcd data directory: %w", err)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd (is port %d or %d taken?): %w", c.ClientPort, c.PeerPort, err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		log.Info("etcd ready", "client_url", client.String())
	case err := <-e.Err():
		return fmt.Errorf("etcd failed while starting: %w", err)
	case <-ctx.Done():
		return nil
	}
	select {
	case err := <-e.Err():
		return fmt.Errorf("etcd failed: %w", err)
	case <-ctx.Done():
		log.Info("etcd stopping")
		return nil
	}
}
