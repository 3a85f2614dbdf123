package secret

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The one list names every secret apiary reads from the environment, and
// Scrub removes each of them (and only them).
func TestScrubRemovesEverySecret(t *testing.T) {
	want := []string{"APIARY_API_TOKEN", "APIARY_ADMIN_TOKEN", "APIARY_CLUSTER_TOKEN", "APIARY_WORKER_TOKEN",
		"APIARY_DATABASE_URL", "PGPASSWORD", "HF_TOKEN", "APIARY_ENGINE_KEY"}
	if diff := cmp.Diff(want, EnvNames()); diff != "" {
		t.Errorf("EnvNames (-want +got)\n%s", diff)
	}
	env := []string{"PATH=/bin", "HOME=/root", "APIARY_QUEEN=http://q:8080", "APIARY_CPU_VARIANT=portable", "NOEQUALS"}
	keep := append([]string(nil), env...)
	for _, name := range want {
		env = append(env, name+"=s3cret", name+"=")
	}
	if diff := cmp.Diff(keep, Scrub(env)); diff != "" {
		t.Errorf("Scrub (-want +got)\n%s", diff)
	}
}

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:s3cret@db.example:5432/apiary?sslmode=require", "postgres://u:xxxxx@db.example:5432/apiary?sslmode=require"},
		{"postgres://u@h/db", "postgres://u@h/db"},
		{"postgresql://h/db?user=u&password=s3cret", "postgresql://h/db?password=xxxxx&user=u"},
		{"postgres://u:s3%2Fcr%40et@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:s3cr@et@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:s3cr%zzet@h/db", "postgres://xxxxx@h/db"}, // does not parse
		{"http://127.0.0.1:8080", "http://127.0.0.1:8080"},
		{"", ""},
	} {
		got := RedactURL(tc.in)
		if got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "s3") {
			t.Errorf("RedactURL(%q) = %q shows the password", tc.in, got)
		}
	}
}

func TestRedactError(t *testing.T) {
	for _, tc := range []struct{ u, pw string }{
		{"postgres://u:s3cret@h/db", "s3cret"},
		{"postgres://u:s3%2Fcr%40et@h/db", "s3/cr@et"},
		{"postgres://u:s3cr%zzet@h/db", "s3cr%zzet"},
		{"postgresql://h/db?password=s3cret", "s3cret"},
	} {
		err := fmt.Errorf("cannot connect to PostgreSQL: %w", fmt.Errorf("cannot parse `%s`: password %s: %w", tc.u, tc.pw, fs.ErrNotExist))
		got := RedactError(err, tc.u)
		if strings.Contains(got.Error(), "s3") {
			t.Errorf("RedactError(%q) = %q shows the password", tc.u, got)
		}
		if !strings.Contains(got.Error(), "cannot connect to PostgreSQL: cannot parse") || !errors.Is(got, fs.ErrNotExist) {
			t.Errorf("RedactError(%q) = %q: lost the message or the chain", tc.u, got)
		}
	}
	// What pgx's own best-effort redaction leaves of a password with "@".
	u := "postgres://u:s3cr@s3cret-tail@h:x/db"
	if got := RedactError(errors.New("cannot parse `postgres://u:xxxxx@s3cret-tail@h:x/db`: invalid port"), u); strings.Contains(got.Error(), "s3") {
		t.Errorf("RedactError(%q) = %q shows part of the password", u, got)
	}
	if RedactError(nil, "postgres://u:p@h/db") != nil {
		t.Error("RedactError(nil) != nil")
	}
	plain := errors.New("no secret here")
	if RedactError(plain, "postgres://u:s3cret@h/db") != plain {
		t.Error("an error without the secret should come back as it is")
	}
}

// A token no header can carry, or one no client's bearer can match, is
// refused, with what is wrong and where but never the token: 20 spaces
// once passed the length check, and a token with a newline was taken.
func TestCheckToken(t *testing.T) {
	for tok, want := range map[string]string{
		"0123456789abcdef0123":            "",
		"A-Za-z0-9._~+/=!#$%&'*^`|{}()<>": "",
		"":                                "", // no token: the daemons' own rules
		strings.Repeat(" ", 20):           "is blank (only white space)",
		"\t\n ":                           "is blank (only white space)",
		"0123456789abcdef\n":              "has a newline at byte 17",
		"0123456789\r\nabcdef":            "has a carriage return at byte 11",
		"01234567 89abcdef":               "has a space at byte 9",
		" 0123456789abcdef":               "has a space at byte 1",
		"0123456789abcdef\t":              "has a tab at byte 17",
		"0123456789abcdef\x00":            "has the control byte 0x00 at byte 17",
		"0123456789abcdef\x7f":            "has the control byte 0x7f at byte 17",
		"0123456789abcdéf":                "has a non-ASCII byte at byte 15",
	} {
		err := CheckToken(tok)
		if want == "" {
			if err != nil {
				t.Errorf("CheckToken(%q) = %v, want nil", tok, err)
			}
			continue
		}
		if err == nil || !strings.HasPrefix(err.Error(), want+"; a token must be printable ASCII without spaces") {
			t.Errorf("CheckToken(%q) = %v, want %q…", tok, err, want)
		}
		if strings.TrimSpace(tok) != "" && strings.Contains(err.Error(), strings.TrimSpace(tok)) {
			t.Errorf("CheckToken(%q) shows the token: %v", tok, err)
		}
	}
}

// A child that serves gets the allow-list of its parent's environment and
// what the operator names, never a secret: the fixed deny-list it
// replaced let SSH_AUTH_SOCK, AWS_* and HUGGING_FACE_HUB_TOKEN through.
func TestChildEnvPassesTheAllowListAndWhatIsNamed(t *testing.T) {
	env := []string{"PATH=/bin", "HOME=/root", "LANG=C.UTF-8", "LC_ALL=C", "TZ=UTC", "TMPDIR=/tmp", "USER=apiary",
		"LD_LIBRARY_PATH=/usr/local/cuda/lib64", "CUDA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute",
		"HIP_VISIBLE_DEVICES=1", "ROCR_VISIBLE_DEVICES=1", "GGML_CUDA_NO_PINNED=1", "LLAMA_CACHE=/c", "OMP_NUM_THREADS=4",
		"HF_ENDPOINT=http://hub", "HTTPS_PROXY=http://proxy:3128", "APIARY_CPU_VARIANT=haswell", "APIARY_LOG_LEVEL=debug",
		"SSH_AUTH_SOCK=/tmp/agent", "AWS_SECRET_ACCESS_KEY=aws-s3cret", "AWS_REGION=eu-west-1", "HUGGING_FACE_HUB_TOKEN=hf-s3cret",
		"APIARY_QUEEN=http://q:8080", "NOTIFY_SOCKET=/run/systemd/notify", "VLLM_USE_V1=1", "VLLM_LOGGING_LEVEL=DEBUG", "NOEQUALS"}
	for _, name := range EnvNames() {
		env = append(env, name+"=s3cret")
	}
	allowed := []string{"PATH=/bin", "HOME=/root", "LANG=C.UTF-8", "LC_ALL=C", "TZ=UTC", "TMPDIR=/tmp", "USER=apiary",
		"LD_LIBRARY_PATH=/usr/local/cuda/lib64", "CUDA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=compute",
		"HIP_VISIBLE_DEVICES=1", "ROCR_VISIBLE_DEVICES=1", "GGML_CUDA_NO_PINNED=1", "LLAMA_CACHE=/c", "OMP_NUM_THREADS=4",
		"HF_ENDPOINT=http://hub", "HTTPS_PROXY=http://proxy:3128", "APIARY_CPU_VARIANT=haswell", "APIARY_LOG_LEVEL=debug"}
	if diff := cmp.Diff(allowed, ChildEnv(env, nil)); diff != "" {
		t.Errorf("ChildEnv without names (-want +got)\n%s", diff)
	}
	named := append(slices.Clone(allowed), "AWS_SECRET_ACCESS_KEY=aws-s3cret", "AWS_REGION=eu-west-1",
		"HUGGING_FACE_HUB_TOKEN=hf-s3cret", "VLLM_USE_V1=1", "VLLM_LOGGING_LEVEL=DEBUG")
	if diff := cmp.Diff(named, ChildEnv(env, []string{"AWS_*", "HUGGING_FACE_HUB_TOKEN", "VLLM_*", "NOT_SET"})); diff != "" {
		t.Errorf("ChildEnv with AWS_*, HUGGING_FACE_HUB_TOKEN, VLLM_* (-want +got)\n%s", diff)
	}
	// "*" passes everything but apiary's secrets.
	for _, kv := range ChildEnv(env, []string{"*"}) {
		if strings.HasSuffix(kv, "=s3cret") {
			t.Errorf("ChildEnv with * passed the secret %s", kv)
		}
	}
	if got := ChildEnv(env, []string{"*"}); !slices.Contains(got, "SSH_AUTH_SOCK=/tmp/agent") {
		t.Errorf("ChildEnv with * lost SSH_AUTH_SOCK: %q", got)
	}
}

func TestCheckPassEnv(t *testing.T) {
	if err := CheckPassEnv([]string{"HF_HOME", "AWS_*", "*", "vllm_x", "A"}); err != nil {
		t.Errorf("good names refused: %v", err)
	}
	for _, bad := range []struct{ entry, says string }{
		{"", "an empty name"},
		{"A=B", `"A=B" is not a variable name`},
		{"A B", `"A B" is not a variable name`},
		{"A*B", `"A*B" is not a variable name`},
		{"A**", `"A**" is not a variable name`},
		{"A\nB", `is not a variable name`},
		{"HF_TOKEN", "HF_TOKEN is a secret of apiary's"},
		{"APIARY_WORKER_TOKEN", "APIARY_WORKER_TOKEN is a secret of apiary's"},
	} {
		if err := CheckPassEnv([]string{"OK", bad.entry}); err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("CheckPassEnv(%q) = %v, want %q", bad.entry, err, bad.says)
		}
	}
}

// PassedEnv keeps what the operator named, and neither the allow-list of
// this machine nor a secret.
func TestPassedEnvIsWhatTheOperatorNamed(t *testing.T) {
	env := []string{"PATH=/bin", "HF_HOME=/cache", "VLLM_X=1", ClusterTokenEnv + "=s", "OTHER=1"}
	got := PassedEnv(env, []string{"HF_HOME", "VLLM_*", ClusterTokenEnv})
	if want := []string{"HF_HOME=/cache", "VLLM_X=1"}; !slices.Equal(got, want) {
		t.Errorf("PassedEnv = %v, want %v", got, want)
	}
}
