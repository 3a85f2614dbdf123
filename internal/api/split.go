package api

// SplitShares divides need over devices in proportion to avail, the
// memory each has free (llama.cpp's tensor_split from their free
// memory; placement and the hive's preflight count the same shares):
// each share is at most its device's when need fits their sum; the
// rounding goes to the first. Equal shares when none has any.
func SplitShares(need uint64, avail []uint64) []uint64 {
	var sum uint64
	for _, a := range avail {
		sum += a
	}
	shares := make([]uint64, len(avail))
	var given uint64
	for i, a := range avail {
		if sum == 0 {
			shares[i] = need / uint64(len(avail))
		} else {
			shares[i] = uint64(float64(need) * float64(a) / float64(sum))
		}
		given += shares[i]
	}
	if len(shares) > 0 && given < need {
		shares[0] += need - given
	}
	return shares
}
