package config

import (
	"errors"
	"testing"
)

func TestProblemsNamesFieldsAndRenameMapsThem(t *testing.T) {
	var inner Problems
	inner.Add("QueueSize", "must be at least 1, got %d", 0)
	inner.Add("LeaseTimeout", "%s must be longer than {HeartbeatInterval} %s", "1s", "2s")
	var p Problems
	p.Add("Addr", "%q: missing port", "x")
	p.Nest("Routing", inner.Err())
	p.Nest("Routing", errors.New("a plain error stays"))
	err := p.Err()
	want := "Addr \"x\": missing port\nRouting.QueueSize must be at least 1, got 0\n" +
		"Routing.LeaseTimeout 1s must be longer than Routing.HeartbeatInterval 2s\na plain error stays"
	if err.Error() != want {
		t.Errorf("Err() =\n%s\nwant\n%s", err, want)
	}
	if n := len(Fields(err)); n != 3 {
		t.Errorf("Fields: %d, want 3", n)
	}
	names := map[string]string{"Addr": "--addr", "Routing.QueueSize": "--queue-size", "Routing.LeaseTimeout": "--lease-timeout",
		"Routing.HeartbeatInterval": "--heartbeat-interval"}
	want = "--addr \"x\": missing port\n--queue-size must be at least 1, got 0\n" +
		"--lease-timeout 1s must be longer than --heartbeat-interval 2s\na plain error stays"
	if got := Rename(err, names).Error(); got != want {
		t.Errorf("Rename =\n%s\nwant\n%s", got, want)
	}
	if Rename(nil, names) != nil || (&Problems{}).Err() != nil {
		t.Error("no problem is no error")
	}
}

func TestDefaultFillsOnlyZeroValues(t *testing.T) {
	n, s, d := 0, "set", -1
	Default(&n, 5)
	Default(&s, "default")
	Default(&d, 7)
	if n != 5 || s != "set" || d != -1 {
		t.Errorf("Default: %d %q %d, want 5 \"set\" -1 (a negative value is the caller's to refuse, not to replace)", n, s, d)
	}
}
