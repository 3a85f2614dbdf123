package hive

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
)

// machineIDFiles are where a Linux system keeps its machine id (systemd's,
// then D-Bus's), in the order they are read.
var machineIDFiles = []string{"/etc/machine-id", "/var/lib/dbus/machine-id"}

// machineID is this machine's id, or "" when no file holds one (a
// container without it, another system).
func machineID() string {
	for _, f := range machineIDFiles {
		if b, err := os.ReadFile(f); err == nil {
			if id := strings.TrimSpace(string(b)); id != "" {
				return id
			}
		}
	}
	return ""
}

// defaultPoolID is the pool id of a hive given neither --pool-id nor
// --node-id: the host name and the first 6 hex digits of a hash of the
// machine id (host-a3f9c1), so that clones of one image with one host
// name still differ where their machine ids do; the host name alone when
// there is no machine id. The machine id itself never leaves the machine
// (systemd asks that it be treated as confidential): only a hash of it
// keyed to apiary, as sd_id128_get_machine_app_specific does.
func defaultPoolID(host, machineID string) string {
	if machineID == "" {
		return host
	}
	sum := sha256.Sum256([]byte("apiary pool id\x00" + machineID))
	return host + "-" + hex.EncodeToString(sum[:3])
}
