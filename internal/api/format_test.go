package api

import "testing"

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]uint64{"8000000000": 8e9, "24GiB": 24 << 30, "1.5 GiB": 3 << 29, "512mib": 512 << 20, "2GB": 2e9, "0": 0, "100 b": 100} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "GiB", "24 gigs", "-1GiB", "1e400", "twelve", "1..5GiB"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
}
