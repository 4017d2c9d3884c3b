package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// byteUnits are the suffixes a size may carry, largest first.
var byteUnits = []struct {
	name string
	size int64
}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// parseBytes reads a size: a whole number of bytes, or one with a binary
// unit ("256MiB", "1 GiB", "4096B", "4096").
func parseBytes(s string) (int64, bool) {
	s = strings.TrimSpace(s)
	unit := int64(1)
	for _, u := range byteUnits {
		if num, ok := strings.CutSuffix(s, u.name); ok {
			s, unit = strings.TrimSpace(num), u.size
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/unit {
		return 0, false
	}
	return n * unit, true
}

// FormatBytes writes a size in the largest binary unit it reaches, with
// one decimal where it is not whole: "256 MiB", "76.3 MiB", "800 B".
func FormatBytes(n int64) string {
	for _, u := range byteUnits {
		if n >= u.size {
			if n%u.size == 0 {
				return fmt.Sprintf("%d %s", n/u.size, u.name)
			}
			return fmt.Sprintf("%.1f %s", float64(n)/float64(u.size), u.name)
		}
	}
	return "0 B"
}
