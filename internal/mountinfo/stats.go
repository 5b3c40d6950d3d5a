package mountinfo

import (
	"encoding/json"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/wheelfs/wheelfs/internal/client"
)

// StatsXattr is the virtual extended attribute, on any object of a
// WheelFS mount, that counts the requests the mount's client sent
// (client.Stats as JSON): the round trips of an operation are the
// difference around it.
const StatsXattr = "user.wheelfs.stats"

// Stats reads the request counts of the client of the mount path is on.
func Stats(path string) (client.Stats, error) {
	var st client.Stats
	buf := make([]byte, 64<<10)
	n, err := unix.Lgetxattr(path, StatsXattr, buf)
	if err != nil {
		return st, fmt.Errorf("%s: %w", path, err)
	}
	if err := json.Unmarshal(buf[:n], &st); err != nil {
		return st, fmt.Errorf("%s: bad stats: %w", path, err)
	}
	return st, nil
}
