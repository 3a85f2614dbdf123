package procs

import (
	"os"
	"testing"
)

func TestReadRSSOfThisProcess(t *testing.T) {
	rss, err := ReadRSS(os.Getpid())
	if err != nil || rss == 0 {
		t.Fatalf("ReadRSS = %d, %v", rss, err)
	}
	if _, err := ReadRSS(1 << 30); err == nil {
		t.Error("ReadRSS of no process succeeded")
	}
}
