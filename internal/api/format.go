package api

import "fmt"

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
