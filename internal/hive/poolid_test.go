package hive

import (
	"os"
	"regexp"
	"testing"
)

// The default pool id was the host name, which cloned machines and
// containers share: it is now the host name and a hash of the machine
// id, which differs where the machine ids do, never holds the machine id
// itself, and is the host name alone where there is none. An explicit
// --node-id or --pool-id is kept as given.
func TestDefaultPoolIDDiffersByMachine(t *testing.T) {
	a := defaultPoolID("gpu-node", "3d1219c7c4c5404aaa1f6d2a48adfda4")
	b := defaultPoolID("gpu-node", "0b6ec4a1e4d94d1b9b4f0a2f9c2b7e11")
	if !regexp.MustCompile(`^gpu-node-[0-9a-f]{6}$`).MatchString(a) || a == b {
		t.Errorf("pool ids of two machines named gpu-node: %q and %q", a, b)
	}
	if again := defaultPoolID("gpu-node", "3d1219c7c4c5404aaa1f6d2a48adfda4"); again != a {
		t.Errorf("one machine's pool id changed: %q, then %q", a, again)
	}
	if got := defaultPoolID("gpu-node", ""); got != "gpu-node" {
		t.Errorf("without a machine id: %q, want the host name", got)
	}

	host, _ := os.Hostname()
	c := Config{}.withDefaults()
	if want := defaultPoolID(host, machineID()); host != "" && (c.PoolID != want || c.NodeID != host) {
		t.Errorf("defaults: pool id %q, node id %q; want %q and %q", c.PoolID, c.NodeID, want, host)
	}
	if c := (Config{NodeID: "n1"}).withDefaults(); c.PoolID != "n1" {
		t.Errorf("with --node-id n1: pool id %q, want n1", c.PoolID)
	}
	if c := (Config{PoolID: "p1"}).withDefaults(); c.PoolID != "p1" || c.NodeID != host {
		t.Errorf("with --pool-id p1: pool id %q, node id %q", c.PoolID, c.NodeID)
	}
}
