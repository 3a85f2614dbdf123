package main

import (
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/apiary-llm/apiary/internal/transport"
)

// addTLSFlags adds --tls-cert and --tls-key, a daemon's certificate.
func addTLSFlags(fl *pflag.FlagSet, t *transport.ServerTLS) {
	fl.StringVar(&t.CertFile, "tls-cert", "", "PEM certificate (chain) to serve HTTPS with, with --tls-key; plain HTTP to the port is then refused")
	fl.StringVar(&t.KeyFile, "tls-key", "", "PEM private key of --tls-cert")
}

// addCAFlag adds the root's --ca-file, and checks the client TLS settings
// before any command runs: a CA file that does not load is a usage error
// at the start, not a failed call later.
func addCAFlag(root *cobra.Command) {
	var caFile string
	root.PersistentFlags().StringVar(&caFile, "ca-file", "", "PEM file of CA certificates to trust besides the system's, for https:// URLs (default $"+transport.CAFileEnv+")")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		transport.SetCAFile(caFile)
		if err := transport.CheckClientTLS(); err != nil {
			return usagef("%v", err)
		}
		return nil
	}
}
