package main

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/cpuvariant"
	"github.com/apiary-llm/apiary/internal/gpu"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/transport"
)

// The allow-list of the children's environment holds what they read of
// apiary's own variables, by the names the packages that read them use:
// a renamed variable would silently stop reaching the workers.
func TestChildEnvAllowsWhatChildrenRead(t *testing.T) {
	for _, name := range []string{cpuvariant.Env, gpu.BackendDirEnv, transport.CAFileEnv, logLevelEnv, logJSONEnv, "HF_ENDPOINT"} {
		if got := secret.ChildEnv([]string{name + "=x"}, nil); !slices.Equal(got, []string{name + "=x"}) {
			t.Errorf("%s does not reach a child: %q", name, got)
		}
	}
}

// --pass-env takes NAME or PREFIX*; a secret of apiary's, or what is no
// variable name, is a usage error that names the flag.
func TestPassEnvRefusesSecretsAndBadNames(t *testing.T) {
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"hive", "--addr", "127.0.0.1:0", "--queen", "", "--pass-env", "HF_HOME,HF_TOKEN"}, "--pass-env HF_TOKEN is a secret of apiary's"},
		{[]string{"queen", "--addr", "127.0.0.1:0", "--pass-env", "AWS_*", "--pass-env", "A*B"}, `--pass-env "A*B" is not a variable name or PREFIX*`},
		{[]string{"engine-front", "--engine-url", "http://127.0.0.1:1", "--pass-env", "APIARY_WORKER_TOKEN", "--", "/bin/true"},
			"--pass-env: APIARY_WORKER_TOKEN is a secret of apiary's"},
	} {
		args := tc.args
		if args[0] != "engine-front" {
			args = append(args, "--data-dir", t.TempDir())
		}
		// A daemon that took the flag would serve until the context ends.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		var errb bytes.Buffer
		code := exitCode(run(ctx, args, io.Discard, &errb), &errb)
		cancel()
		if code != 2 || !strings.Contains(errb.String(), tc.says) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", tc.args, code, errb.String(), tc.says)
		}
	}
}
