package api

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// FormatBytes writes a byte count (memory, a model's size) with binary
// units, as the daemons' messages and the CLI's tables show it: 512 B,
// 699.5 KiB, 4.1 GiB.
func FormatBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// ParseBytes reads a memory size as an operator writes it: a number of
// bytes, or a number with a unit — KiB, MiB, GiB, TiB (powers of 1024) or
// KB, MB, GB, TB (powers of 1000), case not minded, a space allowed
// ("24GiB", "1.5 GiB", "8000000000").
func ParseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	}
	mult := map[string]float64{"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
		"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}[unit]
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || mult == 0 || v < 0 || math.IsInf(v*mult, 0) || v*mult >= 1<<63 {
		return 0, fmt.Errorf("%q is not a size: want bytes, or a number with KiB, MiB, GiB, TiB (or KB, MB, GB, TB), e.g. 24GiB", s)
	}
	return uint64(v * mult), nil
}
