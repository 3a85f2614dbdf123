package main

import "github.com/spf13/cobra"

func newHiveCmd() *cobra.Command { return notImplemented("hive", "Run the pool manager daemon of this node") }
