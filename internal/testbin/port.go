package testbin

import (
	"net"
	"strconv"
	"testing"
)

// FreePort returns a TCP port free on 127.0.0.1 when it is asked (for
// a process a test starts, which binds it itself).
func FreePort(t testing.TB) int { return FreePortOn(t, "127.0.0.1") }

// FreePortOn is FreePort on the address ip.
func FreePortOn(t testing.TB, ip string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// FreeAddr is 127.0.0.1 with a FreePort, as host:port.
func FreeAddr(t testing.TB) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}
