package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/apiary-llm/apiary/internal/config"
	"github.com/apiary-llm/apiary/internal/registry"
	"github.com/apiary-llm/apiary/internal/secret"
	"github.com/apiary-llm/apiary/internal/sshnode"
	"github.com/apiary-llm/apiary/internal/store"
	"github.com/apiary-llm/apiary/internal/transport"
)

// fakeQueen is the queen a fleet serves, at url.
type fakeQueen struct{ url string }

func (q fakeQueen) URL() string                                    { return q.url }
func (fakeQueen) Pool(string) (registry.Pool, bool)                { return registry.Pool{}, false }
func (fakeQueen) Deregister(context.Context, string, string) error { return nil }
func (fakeQueen) Vacate(context.Context, string, string) error     { return nil }
func (fakeQueen) PingHive(context.Context, string) error           { return nil }
func (fakeQueen) Audit(context.Context, store.AuditEntry)          {}

func newFleet(t *testing.T, cfg Config, queenURL string) *Fleet {
	t.Helper()
	cfg.Hives = cfg.Hives.WithDefaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	f := New(cfg, fakeQueen{queenURL})
	t.Cleanup(func() { f.StopAll(); f.Close() })
	return f
}

// Every problem of a Hives is reported, each by its field.
func TestHivesValidateNamesEveryField(t *testing.T) {
	if err := (Hives{}).WithDefaults().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	err := Hives{HiveArgs: []string{"--ok", "-x", "--bad\nline"}, HiveStopTimeout: -time.Second, RestartMin: -1,
		RestartMax: -2, ProbeTimeout: -time.Minute}.Validate()
	var fields []string
	for _, e := range flattenErr(err) {
		var fe *config.FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("not a field error: %v", e)
		}
		fields = append(fields, fe.Field)
	}
	want := []string{"HiveArgs", "HiveArgs", "HiveStopTimeout", "RestartMin", "ProbeTimeout", "RestartMax"}
	if !slices.Equal(fields, want) {
		t.Errorf("fields %v, want %v (%v)", fields, want, err)
	}
}

func flattenErr(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// A stored node becomes a spec: its target parsed, the defaults where its
// row is silent, its metadata's port and TLS files; a bad target or bad
// metadata is an error naming it.
func TestSpecOf(t *testing.T) {
	meta, _ := json.Marshal(Meta{HivePort: 9300, TLS: TLS{Cert: "/etc/c.pem", Key: "/etc/k.pem", CAFile: "/etc/ca.pem"}})
	s, err := SpecOf(store.Node{Name: "n1", SSHTarget: "ops@10.0.0.5:2222", InstallDir: "/opt/apiary", Metadata: meta})
	if err != nil {
		t.Fatal(err)
	}
	if s.name != "n1" || s.target == nil || s.target.User != "ops" || s.installDir != "/opt/apiary" || s.HivePort() != 9300 ||
		s.tls.Cert != "/etc/c.pem" || s.local() {
		t.Errorf("spec %+v (target %+v)", s, s.target)
	}
	s, err = SpecOf(store.Node{Name: "n2", SSHTarget: "10.0.0.6"})
	if err != nil {
		t.Fatal(err)
	}
	if s.installDir != sshnode.DefaultInstallDir || s.HivePort() != DefaultHivePort || s.tls != (TLS{}) {
		t.Errorf("defaults: %+v", s)
	}
	if _, err := SpecOf(store.Node{Name: "n3", SSHTarget: "-oProxyCommand=x@h"}); !errors.Is(err, sshnode.ErrBadTarget) {
		t.Errorf("a bad target: %v", err)
	}
	if _, err := SpecOf(store.Node{Name: "n4", SSHTarget: "h", Metadata: []byte("{")}); err == nil || !strings.Contains(err.Error(), "metadata") {
		t.Errorf("bad metadata: %v", err)
	}
}

// A hive's command line: the queen's flags first (its lease and a beat a
// third of it, bounded), the node's TLS files, the operator's HiveArgs
// last, so that they override; the local hive gets its data directory and
// the queen's own certificate.
func TestHiveArgs(t *testing.T) {
	f := newFleet(t, Config{Hives: Hives{HiveArgs: []string{"--worker-threads=1"}}, DataDir: "/data", HeartbeatTimeout: 90 * time.Second,
		TLS: transport.ServerTLS{CertFile: "/q/cert.pem", KeyFile: "/q/key.pem"}}, "https://queen.example:8443")
	remote := Spec{name: "n1", target: &sshnode.Target{Host: "10.0.0.5"}, tls: TLS{Cert: "/n/c.pem", Key: "/n/k.pem"}}
	args := f.hiveArgs(remote, "10.0.0.5:9200")
	want := []string{"hive", "--addr", "10.0.0.5:9200", "--queen", "https://queen.example:8443", "--pool-id", "n1", "--node-id", "n1",
		"--owner", "queen", "--lifeline", "stdin", "--lease-timeout", "1m30s", "--heartbeat-interval", "10s", "--log-json",
		"--tls-cert", "/n/c.pem", "--tls-key", "/n/k.pem", "--worker-threads=1"}
	if !slices.Equal(args, want) {
		t.Errorf("remote hive args\n got %q\nwant %q", args, want)
	}
	local := f.hiveArgs(Spec{name: LocalPoolID}, "127.0.0.1:0")
	for _, pair := range [][2]string{{"--data-dir", "/data/local-hive"}, {"--tls-cert", "/q/cert.pem"}, {"--tls-key", "/q/key.pem"}} {
		if i := slices.Index(local, pair[0]); i < 0 || i+1 >= len(local) || local[i+1] != pair[1] {
			t.Errorf("local hive args %q: want %s %s", local, pair[0], pair[1])
		}
	}
	if local[len(local)-1] != "--worker-threads=1" {
		t.Errorf("local hive args %q: the operator's come last", local)
	}
	short := newFleet(t, Config{HeartbeatTimeout: 150 * time.Millisecond}, "http://127.0.0.1:1")
	if args := short.hiveArgs(Spec{name: "n"}, "a:1"); !slices.Contains(args, "100ms") {
		t.Errorf("a 150ms lease: want a 100ms beat at least, got %q", args)
	}
}

// The lifeline carries the cluster token and the queen's HF_TOKEN, and
// nothing else; the children's environment has neither. The local hive
// gets the allow-list and what PassEnv names (and passes PassEnv on to
// its workers); ssh, acting for the operator, keeps what is not a
// secret, its agent's socket first.
func TestSecretsGoOnTheLifelineOnly(t *testing.T) {
	t.Setenv(secret.HFTokenEnv, "hf_secret")
	t.Setenv(secret.ClusterTokenEnv, "cluster_secret")
	t.Setenv("APIARY_TEST_PLAIN", "named")
	t.Setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "aws_secret")
	t.Setenv("HUGGING_FACE_HUB_TOKEN", "hub_secret")
	f := newFleet(t, Config{ClusterToken: "cluster_secret", Hives: Hives{PassEnv: []string{"APIARY_TEST_*"}}}, "http://127.0.0.1:1")
	want := []string{secret.ClusterTokenEnv + "=cluster_secret", secret.HFTokenEnv + "=hf_secret"}
	if got := f.lifelineEnv(); !slices.Equal(got, want) {
		t.Errorf("lifeline %q, want %q", got, want)
	}
	local, ssh := f.childEnviron(true), f.childEnviron(false)
	for _, kv := range append(slices.Clone(local), ssh...) {
		if strings.Contains(kv, "hf_secret") || strings.Contains(kv, "cluster_secret") {
			t.Errorf("a child's environment holds %q", kv)
		}
	}
	for _, kv := range local {
		if strings.Contains(kv, "agent.sock") || strings.Contains(kv, "aws_secret") || strings.Contains(kv, "hub_secret") {
			t.Errorf("the local hive's environment holds %q, which no one named", kv)
		}
	}
	if !slices.Contains(local, "APIARY_TEST_PLAIN=named") || !slices.Contains(local, "PATH="+os.Getenv("PATH")) {
		t.Errorf("the local hive's environment lost a named or an allowed variable: %q", local)
	}
	if !slices.Contains(ssh, "SSH_AUTH_SOCK=/tmp/agent.sock") {
		t.Error("ssh lost the agent's socket")
	}
	if args := f.hiveArgs(Spec{name: "n"}, "a:1"); !slices.Contains(args, "--pass-env") || !slices.Contains(args, "APIARY_TEST_*") {
		t.Errorf("a hive's command line without the queen's --pass-env: %q", args)
	}
	t.Setenv(secret.HFTokenEnv, "")
	if got := newFleet(t, Config{}, "http://127.0.0.1:1").lifelineEnv(); len(got) != 0 {
		t.Errorf("no token: lifeline %q", got)
	}
}

// A node on another machine needs a queen it can reach and a cluster
// token; a loopback node needs neither.
func TestReachable(t *testing.T) {
	loop := newFleet(t, Config{}, "http://127.0.0.1:8080")
	if err := loop.Reachable("n", "127.0.0.1"); err != nil {
		t.Errorf("loopback node: %v", err)
	}
	err := loop.Reachable("n", "10.0.0.5")
	if err == nil || !strings.Contains(err.Error(), "--advertise") || !strings.Contains(err.Error(), secret.ClusterTokenEnv) {
		t.Errorf("remote node of a loopback queen without a token: %v", err)
	}
	open := newFleet(t, Config{ClusterToken: "tok"}, "http://10.0.0.1:8080")
	if err := open.Reachable("n", "10.0.0.5"); err != nil {
		t.Errorf("remote node of a reachable queen with a token: %v", err)
	}
}

// A stopping fleet starts no hive.
func TestStoppedFleetStartsNothing(t *testing.T) {
	f := newFleet(t, Config{}, "http://127.0.0.1:1")
	f.StopAll()
	if !f.Stopped() {
		t.Error("not stopped after StopAll")
	}
	if err := f.Add(Spec{name: "n"}); !errors.Is(err, ErrStopping) {
		t.Errorf("Add after StopAll: %v", err)
	}
	if names := f.Names(); len(names) != 0 {
		t.Errorf("hives %v", names)
	}
}
