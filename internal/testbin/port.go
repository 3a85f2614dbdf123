package testbin

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
)

// FreePort returns a TCP port free on 127.0.0.1 when it is asked (for
// a process a test starts, which binds it itself).
func FreePort(t testing.TB) int { return FreePortOn(t, "127.0.0.1") }

// FreePortOn is FreePort on the address ip. The port is drawn from
// freePortMin … freePortMax-1, below the kernel's ephemeral range
// (32768–60999 by default): a port the kernel hands out (":0") is free
// until a daemon binds it, and any process's outgoing connection may take
// it as its source port meanwhile — with packages' tests running side by
// side, a queen then failed to bind the address it was given ("address
// already in use"). The worker port ranges of the tests (8001–8999,
// 22000–28999) are outside it too.
func FreePortOn(t testing.TB, ip string) int {
	t.Helper()
	var last error
	for range 200 {
		port := freePortMin + rand.IntN(freePortMax-freePortMin)
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			last = err
			continue
		}
		ln.Close()
		return port
	}
	t.Fatalf("no free port on %s in %d-%d: %v", ip, freePortMin, freePortMax-1, last)
	return 0
}

// The range FreePortOn draws from.
const freePortMin, freePortMax = 10000, 20000

// FreeAddr is 127.0.0.1 with a FreePort, as host:port.
func FreeAddr(t testing.TB) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}
