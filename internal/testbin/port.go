package testbin

import (
	"net"
	"testing"
)

// FreePort returns a TCP port free on 127.0.0.1 when it is asked (for
// a process a test starts, which binds it itself).
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
