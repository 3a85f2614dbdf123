package main

import (
	"github.com/spf13/pflag"

	"github.com/apiary-llm/apiary/internal/config"
)

// The flag of each config field, per command: the libraries' Validate
// names fields (config.FieldError), and these tables are the one place
// that turns them into the flags a person typed.
var (
	queenFields = map[string]string{
		"Addr": "--addr", "Advertise": "--advertise", "DataDir": "--data-dir", "DatabaseURL": "--database-url",
		"HeartbeatTimeout": "--heartbeat-timeout", "UnhealthyGrace": "--unhealthy-grace", "OfflineRetention": "--offline-retention",
		"FlushInterval": "--flush-interval", "HiveTimeout": "--hive-timeout",
		"LeaseDuration": "--lease-duration", "LeaseRenew": "--lease-renew",
		"ClaimTimeout": "--claim-timeout", "ClaimHealthInterval": "--claim-health-interval", "AuditRetention": "--audit-retention",
		"RowsRetention": "--rows-retention", "ModelsFile": "--config", "ModelsPoll": "--config-poll", "MaxBodyBytes": "--max-body-bytes", "TLS": "--tls-cert/--tls-key",
		"CORSOrigins": "--cors-origin", "Tokens": "the tokens (APIARY_API_TOKEN, APIARY_ADMIN_TOKEN, APIARY_CLUSTER_TOKEN)",
		"Tokens.API": "APIARY_API_TOKEN", "Tokens.Admin": "APIARY_ADMIN_TOKEN", "Tokens.Cluster": "APIARY_CLUSTER_TOKEN",
		"Ownership.Owner": "--owner", "Ownership.HiveArgs": "--hive-arg", "Ownership.PassEnv": "--pass-env", "Ownership.HiveStopTimeout": "--hive-stop-timeout",
		"Routing.Routing": "--routing", "Routing.AffinityTTL": "--affinity-ttl", "Routing.QueueSize": "--queue-size", "Routing.QueueTimeout": "--queue-timeout", "Routing.SwapWait": "--swap-wait", "Routing.MinResidency": "--min-residency",
		"Routing.ScaleUpAfter": "--scale-up-after", "Routing.MaxWorkers": "--max-workers", "Routing.ModelMaxWorkers": "--model-max-workers",
		"Routing.WorkerSlots": "--worker-slots", "Routing.ModelsRefresh": "--models-refresh", "Routing.MaxBodyBytes": "--max-body-bytes",
		"Routing.StrikeLimit":       "--strike-limit",
		"Routing.CrashLoopFailures": "--crashloop-failures", "Routing.CrashLoopWindow": "--crashloop-window",
		"Routing.CrashLoopBackoff": "--crashloop-backoff", "Routing.StableAfter": "--stable-after",
		"Batch.MaxFileBytes": "--batch-max-file-bytes", "Batch.FileRetention": "--batch-file-retention",
		"Batch.MaxAttempts": "--batch-max-attempts", "Batch.Concurrency": "--batch-concurrency",
		"Batch.MaxLines": "--batch-max-lines", "Batch.MaxLineBytes": "--max-body-bytes", "Batch.MaxFiles": "--batch-max-files",
		"Batch.MaxOpenBatches": "--batch-max-open-batches", "Batch.AttemptTimeout": "--batch-attempt-timeout",
		"Batch.MaxAnswerBytes": "--batch-max-answer-bytes",
	}
	inferFields = map[string]string{
		"Model": "--model", "Prompt": "--prompt", "MaxTokens": "--max-tokens", "WorkerThreads": "--worker-threads",
		"Node": "--node", "QueenURL": "--queen", "SSH": "--ssh", "SSHConfig": "--ssh-config", "InstallDir": "--install-dir",
	}
	hiveFields = map[string]string{
		"Addr": "--addr", "Advertise": "--advertise", "QueenURL": "--queen", "TLS": "--tls-cert/--tls-key", "Kube": "--kubernetes",
		"PortMin": "--worker-ports", "CallbackTimeout": "--callback-timeout", "HealthInterval": "--health-interval",
		"StopGrace": "--stop-grace", "ShutdownAck": "--shutdown-ack", "HeartbeatInterval": "--heartbeat-interval",
		"WorkerSlots": "--worker-slots", "WorkerThreads": "--worker-threads", "CtxSize": "--worker-ctx-size", "SplitMode": "--split-mode",
		"Owner": "--owner", "LeaseTimeout": "--lease-timeout", "ClusterToken": "APIARY_CLUSTER_TOKEN",
		"PassEnv": "--pass-env", "PullStallTimeout": "--pull-stall-timeout",
		"Kubeconfig": "--kubernetes", "Namespace": "--kube-namespace", "Image": "--kube-image", "ModelsPVC": "--kube-models-pvc",
		"ModelsHostPath": "--kube-models-hostpath", "ModelsDir": "--models-dir",
	}
	frontFields = map[string]string{
		"EngineURL": "--engine-url", "HealthPath": "--health", "WorkerID": "--worker-id", "Slots": "--slots",
		"ShutdownGrace": "--shutdown-grace", "StopWait": "--stop-wait", "Token": "APIARY_WORKER_TOKEN", "EngineKey": "APIARY_ENGINE_KEY",
	}
)

// configError is a library's refusal of a config built from flags: a
// usage error that names the flags.
func configError(err error, fields map[string]string) error {
	return usagef("%v", config.Rename(err, fields))
}

// notZero refuses a 0 typed for a flag whose 0 the library would take as
// "the default": every other value is the library's to check.
func notZero(fl *pflag.FlagSet, names ...string) error {
	for _, n := range names {
		if f := fl.Lookup(n); f != nil && f.Changed && (f.Value.String() == "0" || f.Value.String() == "0s") {
			return usagef("--%s must be positive, got %s", n, f.Value.String())
		}
	}
	return nil
}
