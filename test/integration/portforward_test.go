package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"

	"google.golang.org/grpc/codes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/berthcri/berth/internal/testutil/berthdtest"
)

// streamDialer builds the client side kubectl and critest use, over SPDY or
// SPDY-over-websocket.
func streamDialer(t *testing.T, transport, rawURL string) httpstream.Dialer {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{}
	switch transport {
	case "spdy":
		tr, upgrader, err := spdy.RoundTripperFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: tr}, "POST", u)
	case "websocket":
		d, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, cfg)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	t.Fatalf("unknown transport %s", transport)
	return nil
}

// forward port-forwards a free local port to podPort through url and
// returns the local address and a stop function.
func forward(t *testing.T, transport, rawURL string, podPort int) (string, func()) {
	t.Helper()
	stop, ready := make(chan struct{}), make(chan struct{})
	pf, err := portforward.NewForStreaming(streamDialer(t, transport, rawURL), []string{fmt.Sprintf("0:%d", podPort)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- pf.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errc:
		t.Fatalf("port-forward over %s: %v", transport, err)
	}
	ports, err := pf.GetPorts()
	if err != nil || len(ports) != 1 {
		t.Fatalf("forwarded ports %v: %v", ports, err)
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0].Local), func() { close(stop); <-errc }
}

// The websocket case is SPDY tunnelled over websocket, what newer kubectl
// and critest's websocket mode send.
func TestPortForwardIntoThePodNetworkOverSPDYAndWebsocket(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	id := runPod(t, d, podConfig("pf"))
	t.Cleanup(func() { stopRemove(t, d, id) })
	_, info := podStatus(t, d, id)
	const podPort = 8080
	serveInNetns(t, info.NetNSPath, podPort)

	for _, transport := range []string{"spdy", "websocket"} {
		t.Run(transport, func(t *testing.T) {
			resp, err := d.Runtime.PortForward(berthdtest.Ctx(t), &criapi.PortForwardRequest{PodSandboxId: id, Port: []int32{podPort}})
			if err != nil {
				t.Fatal(err)
			}
			local, stop := forward(t, transport, resp.Url, podPort)
			defer stop()
			// Several connections through one forward, one after another.
			for i := 0; i < 3; i++ {
				if err := dialHello(local); err != nil {
					t.Fatalf("connection %d through the forward: %v", i, err)
				}
			}
		})
	}
}

func TestPortForwardRejectsBadRequests(t *testing.T) {
	t.Parallel()
	d := berthdtest.Start(t, berthdtest.Options{})
	ctx := berthdtest.Ctx(t)
	_, err := d.Runtime.PortForward(ctx, &criapi.PortForwardRequest{})
	berthdtest.WantCode(t, err, codes.InvalidArgument)
	_, err = d.Runtime.PortForward(ctx, &criapi.PortForwardRequest{PodSandboxId: "nonexistent", Port: []int32{80}})
	berthdtest.WantCode(t, err, codes.NotFound)
	id := runPod(t, d, podConfig("pfstopped"))
	if _, err := d.Runtime.StopPodSandbox(ctx, &criapi.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
	_, err = d.Runtime.PortForward(ctx, &criapi.PortForwardRequest{PodSandboxId: id, Port: []int32{80}})
	berthdtest.WantCode(t, err, codes.FailedPrecondition)
	if _, err := d.Runtime.RemovePodSandbox(ctx, &criapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		t.Fatal(err)
	}
}
