package secret

import (
	"fmt"
	"slices"
	"strings"
)

// childEnvAllowed is the allow-list of ChildEnv: what the processes that
// serve (a hive the queen starts, a hive's workers and engine fronts, an
// engine) need of their parent's environment. An entry is a NAME, or a
// PREFIX* that passes every variable whose name starts with PREFIX.
var childEnvAllowed = []string{
	// The system's: where programs and libraries are (the CUDA runtime
	// and NVML are often found through LD_LIBRARY_PATH), whose the
	// process is and where its home is, language, time zone, and where
	// temporary files go.
	"PATH", "LD_LIBRARY_PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR",
	// The GPU runtimes, ggml and llama.cpp, OpenMP: CUDA_VISIBLE_DEVICES,
	// NVIDIA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES,
	// GGML_CUDA_*, OMP_NUM_THREADS, ….
	"CUDA_*", "NVIDIA_*", "HIP_*", "ROCR_*", "GGML_*", "LLAMA_*", "OMP_*",
	// A hive's pulls from the Hugging Face Hub: where the Hub is
	// (internal/modelstore), and what Go's HTTP client reads to reach it
	// (a proxy, the CAs to trust).
	"HF_ENDPOINT", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "SSL_CERT_FILE", "SSL_CERT_DIR",
	// apiary's own that a child reads: the CPU backend a worker loads
	// (internal/cpuvariant), where the GPU backend is (internal/gpu: a
	// worker loads it, a hive checks it can serve its GPUs), the CA
	// every daemon trusts (internal/transport), and the log settings
	// (cmd/apiary). Their names are checked against those packages'
	// constants in cmd/apiary's tests.
	"APIARY_CPU_VARIANT", "APIARY_BACKEND_DIR", "APIARY_CA_FILE", "APIARY_LOG_LEVEL", "APIARY_LOG_JSON",
}

// ChildEnvAllowed lists ChildEnv's allow-list, for docs and tests.
func ChildEnvAllowed() []string { return slices.Clone(childEnvAllowed) }

// ChildEnv returns the environment of a child process that serves (a
// hive the queen starts, a worker, an engine's front and its engine)
// from env ("KEY=value" entries, as os.Environ gives them): only the
// variables of the allow-list (ChildEnvAllowed) and those the operator
// names in pass (NAME or PREFIX*, checked by CheckPassEnv), and never a
// secret of EnvNames, whatever pass says. Everything else the parent
// holds (an ssh agent's socket, cloud credentials, another program's
// token) stays with it. A child that needs a secret gets exactly that
// one added by its parent, after this.
func ChildEnv(env []string, pass []string) []string { return filterEnv(env, childEnvAllowed, pass) }

// PassedEnv is the part of env the operator names in pass alone (NAME or
// PREFIX*), never a secret of EnvNames: the environment of a child on
// another machine (a Kubernetes Pod), to which the allow-list of this
// machine's PATH, HOME, CUDA_* and the rest does not apply.
func PassedEnv(env []string, pass []string) []string { return filterEnv(env, nil, pass) }

// filterEnv keeps the entries of env named in allowed or pass, secrets
// never.
func filterEnv(env, allowed, pass []string) []string {
	secrets := EnvNames()
	out := make([]string, 0, len(env))
	for _, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || slices.Contains(secrets, k) || !matchesAny(k, allowed) && !matchesAny(k, pass) {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// matchesAny reports whether name is one of entries or starts with the
// prefix of one ending in "*".
func matchesAny(name string, entries []string) bool {
	for _, e := range entries {
		if prefix, ok := strings.CutSuffix(e, "*"); ok {
			if strings.HasPrefix(name, prefix) {
				return true
			}
		} else if name == e {
			return true
		}
	}
	return false
}

// CheckPassEnv checks the operator's additions to ChildEnv's allow-list
// (--pass-env): each a variable's name, or a prefix and "*" (a "*"
// alone passes every variable but apiary's secrets), without "=", ",",
// white space or control bytes. An exact name of one of apiary's secrets
// is refused: no child gets one from its parent's environment.
func CheckPassEnv(pass []string) error {
	for _, e := range pass {
		name := strings.TrimSuffix(e, "*")
		switch {
		case e == "":
			return fmt.Errorf("an empty name; give NAME or PREFIX*, e.g. HF_HOME or VLLM_*")
		case strings.ContainsAny(name, "=,*") || strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r == 0x7f }):
			return fmt.Errorf("%q is not a variable name or PREFIX*: a name has no =, comma, white space or control byte, and * may only end it", e)
		case slices.Contains(EnvNames(), e):
			return fmt.Errorf("%s is a secret of apiary's, which no child gets from its parent's environment (a hive the queen starts gets the cluster token and HF_TOKEN on its lifeline, a worker its own token)", e)
		}
	}
	return nil
}
