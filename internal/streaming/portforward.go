package streaming

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/berthcri/berth/internal/netns"
)

// PortForward connects stream to port on the pod's loopback, inside the
// network namespace at netnsPath ("" for the host's), and copies both ways
// until either side closes. IPv4 loopback is tried first, then IPv6, as
// containerd does.
func PortForward(ctx context.Context, netnsPath string, port int32, stream io.ReadWriteCloser) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("port-forward: invalid port %d", port)
	}
	var conn net.Conn
	dial := func() error {
		var errs []error
		d := net.Dialer{Timeout: 10 * time.Second}
		for _, host := range []string{"127.0.0.1", "::1"} {
			c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(int(port))))
			if err == nil {
				conn = c
				return nil
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
	var err error
	if netnsPath == "" {
		err = dial()
	} else {
		err = netns.Do(netnsPath, dial)
	}
	if err != nil {
		return fmt.Errorf("port-forward: dial port %d in pod network: %w", port, err)
	}
	defer conn.Close()

	sent := make(chan error, 1)     // client → pod finished
	received := make(chan error, 1) // pod → client finished
	go func() {
		_, err := io.Copy(conn, stream)
		// The client finished sending: half-close so the server sees EOF
		// and can still answer.
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		sent <- err
	}()
	go func() {
		_, err := io.Copy(stream, conn)
		received <- err
	}()
	select {
	case err = <-received:
	case err = <-sent:
		if err == nil {
			// Input ended cleanly: the reply may still be on its way.
			select {
			case err = <-received:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	stream.Close()
	return err
}
